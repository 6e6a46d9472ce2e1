"""The per-choice output parser: reasoning first, then tool calls in the content part.

`OutputParser.feed(text)` is the one call the per-token loop makes after stop strings
(and `finish()` once at the end); with neither parser configured it returns the text
as content. `parse(text)` is the non-streaming result of the same parsers.
"""

from __future__ import annotations

from collections.abc import Callable

from .reasoning import ReasoningParser
from .tool_stream import ToolParser
from .types import EMPTY, ParsedDelta, ParsedOutput, ToolCall, ToolCallDelta


class OutputParser:
    __slots__ = ("reasoning", "tools")

    def __init__(self, reasoning: ReasoningParser | None, tools: ToolParser | None) -> None:
        self.reasoning = reasoning
        self.tools = tools

    @property
    def in_reasoning(self) -> bool:
        """Inside the reasoning block: the next delta's tokens count as reasoning tokens."""
        return self.reasoning is not None and self.reasoning.in_reasoning

    @property
    def called(self) -> bool:
        """Whether a tool call was emitted (finish_reason "tool_calls")."""
        return self.tools is not None and self.tools.called

    @property
    def calls(self) -> list[ToolCall]:
        return self.tools.calls if self.tools is not None else []

    def feeder(self) -> Callable[[str], ParsedDelta]:
        """The cheapest callable equivalent to `feed` for this parser (a per-token loop
        binds it once): the only parser's own feed when just one is configured."""
        if self.reasoning is None and self.tools is not None:
            return self.tools.feed
        if self.tools is None and self.reasoning is not None:
            return self.reasoning.feed
        return self.feed

    def feed(self, text: str) -> ParsedDelta:
        reasoning = self.reasoning
        tools = self.tools
        if reasoning is None:
            if tools is not None:
                return tools.feed(text)
            return (text, "", ()) if text else EMPTY
        split = reasoning.feed(text)
        if tools is None or not split[0]:
            return split
        parsed = tools.feed(split[0])
        if not split[1]:
            return parsed
        return (parsed[0], split[1], parsed[2])

    def finish(self) -> ParsedDelta:
        reasoning_text = ""
        content = ""
        calls: tuple[ToolCallDelta, ...] = ()
        if self.reasoning is not None:
            content, reasoning_text, _ = self.reasoning.finish()
        if self.tools is not None:
            fed, _, fed_calls = self.tools.feed(content) if content else EMPTY
            end, _, end_calls = self.tools.finish()
            content = fed + end
            calls = fed_calls + end_calls
        if not (content or reasoning_text or calls):
            return EMPTY
        return (content, reasoning_text, calls)

    def parse(self, text: str) -> ParsedOutput:
        """The whole output at once (use a parser made with strict tool parsing)."""
        content, reasoning, _ = self.feed(text)
        end, end_reasoning, _ = self.finish()
        return ParsedOutput(content + end, reasoning + end_reasoning, tuple(self.calls))
