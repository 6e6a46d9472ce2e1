"""What the output parsers produce: text deltas, OpenAI tool-call deltas, final tool calls.

One event shape for every parser: the tuple `(content, reasoning, tool_calls)` (the type
`ParsedDelta`), returned by each `feed(text)` and by `finish()`; unpack it. A plain tuple
because it is made once per token (a NamedTuple costs several times as much to build).
`EMPTY` is returned (not allocated) when a delta yields nothing yet, e.g. while a possible
marker is held back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(slots=True)
class ToolCallDelta:
    """One streamed piece of a tool call, as OpenAI's `delta.tool_calls[i]`.

    The first delta of a call carries `id` and `name` (type "function") with empty
    arguments; the following ones carry argument fragments only. (Not frozen: made per
    token while arguments stream, and a frozen dataclass is slower to build.)
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        if self.name is not None:
            return {
                "index": self.index,
                "id": self.id,
                "type": "function",
                "function": {"name": self.name, "arguments": self.arguments},
            }
        return {"index": self.index, "function": {"arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call, as OpenAI's `message.tool_calls[i]`; `arguments` is JSON text."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


# (content, reasoning, tool_calls): text for `delta.content`, for
# `delta.reasoning_content`, and the `delta.tool_calls` entries, each possibly empty.
ParsedDelta = tuple[str, str, tuple[ToolCallDelta, ...]]

EMPTY: ParsedDelta = ("", "", ())


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """A whole completion split: the non-streaming result (`content` "" when none)."""

    content: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]


class StreamParser(Protocol):
    """Per request and choice: fed the detokenized text deltas in order, then finished."""

    def feed(self, text: str) -> ParsedDelta: ...

    def finish(self) -> ParsedDelta: ...
