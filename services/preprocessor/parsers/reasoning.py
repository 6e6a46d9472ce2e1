"""Reasoning parsers: `<think>...</think>` split from the answer (DeepSeek-R1, Qwen3, ...).

Where the output starts decides the mode, per request (`ReasoningFormat.parser`):
- thinking switched off (`chat_template_kwargs` `enable_thinking` / `thinking` false), or
  the prompt ends with a closed block (`<think>\\n\\n</think>`, DeepSeek-V3.1's `</think>`):
  no parser, nothing is reasoning;
- the prompt ends with `<think>` (the template opened the block) or the family always
  reasons first (DeepSeek-R1): the output starts inside the reasoning (a `<think>` the
  model writes anyway is dropped);
- otherwise, for a family the switch decides (DeepSeek-V3.1, whose template opens or closes
  the block by it; another template may do neither): reasoning first when the switch is on,
  none when off or not given;
- otherwise the output is reasoning only if it opens with `<think>` (Qwen3).
The reasoning ends at `</think>` or, for families whose models may call a tool straight
from their thinking, at the tool-call marker (which then starts the content). Whitespace
around the reasoning and at the start of the answer after it is trimmed, the same
streaming and not (so only a whitespace tail is ever held back, besides a partial marker).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .scan import WHITESPACE, find_first, partial_suffix_any
from .types import EMPTY, ParsedDelta

# _LEAD: may open with <think>; _OPENING: inside, a leading <think> is dropped; _STRIP:
# inside, leading whitespace is dropped; _AFTER: the answer's leading whitespace is dropped.
_LEAD, _OPENING, _STRIP, _REASONING, _AFTER, _CONTENT = range(6)


class ReasoningParser:
    """Per request and choice: `feed(text)` -> (content, reasoning, ())."""

    __slots__ = ("_start", "_end", "_markers", "_firsts", "_exits", "_state", "_held")

    def __init__(
        self,
        start: str = "<think>",
        end: str = "</think>",
        *,
        opened: bool = False,
        exits: tuple[str, ...] = (),
    ) -> None:
        self._start = start
        self._end = end
        self._exits = exits
        self._markers = (end, *exits)
        self._firsts = "".join(sorted({m[0] for m in self._markers}))
        self._state = _OPENING if opened else _LEAD
        self._held = ""

    @property
    def in_reasoning(self) -> bool:
        """Inside the reasoning block: the tokens of the next delta count as reasoning."""
        return _OPENING <= self._state <= _REASONING

    def feed(self, text: str) -> ParsedDelta:
        state = self._state
        if state == _CONTENT:
            return (text, "", ()) if text else EMPTY
        if state == _REASONING and not self._held:
            for char in self._firsts:
                if char in text:
                    break
            else:  # no marker can start here: all of it is reasoning, but a whitespace tail
                kept = text.rstrip(WHITESPACE)
                if len(kept) != len(text):
                    self._held = text[len(kept) :]
                return ("", kept, ()) if kept else EMPTY
        buf = self._held + text if self._held else text
        self._held = ""
        reasoning = ""
        while True:
            state = self._state
            if state == _LEAD or state == _OPENING:
                rest = buf.lstrip(WHITESPACE)
                if not rest:
                    if state == _LEAD:
                        self._held = buf
                    break
                if rest.startswith(self._start):
                    buf = rest[len(self._start) :]
                    self._state = _STRIP
                    continue
                if self._start.startswith(rest):
                    self._held = buf if state == _LEAD else rest
                    break
                if state == _LEAD:
                    self._state = _CONTENT
                    return (buf, reasoning, ())
                self._state = _REASONING
                buf = rest
                continue
            if state == _STRIP:
                buf = buf.lstrip(WHITESPACE)
                if not buf:
                    break
                self._state = _REASONING
                continue
            if state == _REASONING:
                at, marker = find_first(buf, self._markers)
                if at != -1:
                    reasoning += buf[:at].rstrip(WHITESPACE)
                    if marker == self._end:
                        buf = buf[at + len(marker) :]
                        self._state = _AFTER
                    else:  # a tool call straight from the thinking: it starts the content
                        self._state = _CONTENT
                        return (buf[at:], reasoning, ())
                    continue
                hold = partial_suffix_any(buf, self._markers)
                body = buf[: len(buf) - hold]
                kept = body.rstrip(WHITESPACE)
                reasoning += kept
                self._held = buf[len(kept) :]
                break
            # _AFTER: the answer starts at its first non-whitespace character
            rest = buf.lstrip(WHITESPACE)
            if rest:
                self._state = _CONTENT
                return (rest, reasoning, ())
            break
        return ("", reasoning, ()) if reasoning else EMPTY

    def finish(self) -> ParsedDelta:
        held, self._held = self._held, ""
        if self._state == _LEAD and held:
            return (held, "", ())
        if (self._state == _REASONING or self._state == _OPENING) and held:
            kept = held.rstrip(WHITESPACE)
            if kept:
                return ("", kept, ())
        return EMPTY


def thinking_requested(kwargs: Mapping[str, Any] | None, keys: tuple[str, ...]) -> bool | None:
    """The request's thinking switch in chat_template_kwargs: False if any key says off,
    True if one says on, None when none is given."""
    if not kwargs:
        return None
    said: bool | None = None
    for key in keys:
        value = kwargs.get(key)
        if value is None:
            continue
        if not value:
            return False
        said = True
    return said


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    name: str
    start: str = "<think>"
    end: str = "</think>"
    # The model reasons first even when the prompt does not open the block (DeepSeek-R1).
    forced: bool = False
    # The request's thinking switch decides when the template neither opens nor closes the
    # block (DeepSeek-V3.1's does both): on, the output starts inside the reasoning; off or
    # not given, nothing is reasoning. vLLM's deepseek_v3 parser does the same.
    by_switch: bool = False
    # Markers that end the reasoning and begin the content (a tool call from the thinking).
    exits: tuple[str, ...] = ()
    # chat_template_kwargs that switch thinking on or off.
    switches: tuple[str, ...] = ("enable_thinking", "thinking")

    def parser(
        self, prompt: str = "", chat_template_kwargs: Mapping[str, Any] | None = None
    ) -> ReasoningParser | None:
        """The parser for one request, given its rendered prompt; None: nothing to split."""
        requested = thinking_requested(chat_template_kwargs, self.switches)
        if requested is False:
            return None
        tail = prompt.rstrip(WHITESPACE)
        opened = tail.endswith(self.start)
        if not opened and tail.endswith(self.end):
            return None  # the template closed the block: thinking is off
        if self.by_switch and not opened:
            if not requested:
                return None
            opened = True
        return ReasoningParser(self.start, self.end, opened=opened or self.forced, exits=self.exits)
