"""The per-choice output parser: reasoning first, then tool calls in the content part.

`OutputParser.feed(text)` is the one call the per-token loop makes after stop strings
(and `finish()` once at the end); with neither parser configured it returns the text
as content. `parse(text)` is the non-streaming result of the same parsers.
"""

from __future__ import annotations

from .reasoning import ReasoningParser
from .tool_stream import ToolParser
from .types import EMPTY, ParsedDelta, ParsedOutput, ToolCall


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

    def feed(self, text: str) -> ParsedDelta:
        reasoning = self.reasoning
        tools = self.tools
        if reasoning is None:
            if tools is not None:
                return tools.feed(text)
            return ParsedDelta(text, "", ()) if text else EMPTY
        split = reasoning.feed(text)
        if tools is None or not split.content:
            return split
        parsed = tools.feed(split.content)
        if not split.reasoning:
            return parsed
        return ParsedDelta(parsed.content, split.reasoning, parsed.tool_calls)

    def finish(self) -> ParsedDelta:
        reasoning_text = ""
        content = ""
        calls: tuple = ()
        if self.reasoning is not None:
            last = self.reasoning.finish()
            reasoning_text = last.reasoning
            content = last.content
        if self.tools is not None:
            parsed = self.tools.feed(content) if content else EMPTY
            end = self.tools.finish()
            content = parsed.content + end.content
            calls = parsed.tool_calls + end.tool_calls
        if not (content or reasoning_text or calls):
            return EMPTY
        return ParsedDelta(content, reasoning_text, calls)

    def parse(self, text: str) -> ParsedOutput:
        """The whole output at once (use a parser made with strict tool parsing)."""
        first = self.feed(text)
        last = self.finish()
        return ParsedOutput(
            first.content + last.content,
            first.reasoning + last.reasoning,
            tuple(self.calls),
        )
