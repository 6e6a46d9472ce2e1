"""The streaming machinery every tool-call parser shares; a family adds its grammar.

Outside tool markup the text is content. The parser looks for the family's start markers
and holds back only a tail that could still begin one (a delta without any marker's first
character costs one `in` test per marker). From a start marker on, the family's
`_section(final)` consumes the markup and reports calls through `_open_call`, `_args` and
`_close_call`; it calls `_fail()` on markup it cannot read.

Two policies, same results on well-formed markup:
- progressive (streaming default): a call's first delta (id, name) goes out as soon as its
  name is read and known, then its argument text as it arrives, as the engines stream it.
  Arguments are not validated: a call already announced stays a call.
- strict (`parse_complete`, or `strict=True`): a call goes out only once it is complete
  and its arguments are valid JSON; anything else falls back to content.
Either way: an unknown tool name, or markup that does not follow the family's format
before a call was announced, falls back to content (the raw text, markers included);
markup never leaks into content otherwise; nothing raises out of `feed`/`finish`.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Callable, Iterable
from typing import Any

from .scan import WHITESPACE, find_first, partial_suffix_any
from .types import EMPTY, ParsedDelta, ParsedOutput, ToolCall, ToolCallDelta

log = logging.getLogger(__name__)


def openai_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class _OpenCall:
    __slots__ = ("index", "id", "name", "parts", "ignored")

    def __init__(self, index: int, call_id: str, name: str, ignored: bool) -> None:
        self.index = index
        self.id = call_id
        self.name = name
        self.parts: list[str] = []
        self.ignored = ignored


class ToolParser:
    """Base of the per-request tool-call parsers (one instance per choice)."""

    name = ""
    start_markers: tuple[str, ...] = ()
    # The family's markers are special tokens the detokenizer must keep
    # (skip_special_tokens=False for the request).
    needs_special_tokens = False

    def __init__(
        self,
        tool_names: Iterable[str] | None = None,
        *,
        strict: bool = False,
        new_id: Callable[[], str] | None = None,
        max_calls: int | None = None,
    ) -> None:
        """`tool_names`: the request's tools (a call to any other name is content; None
        accepts any); `max_calls`: calls beyond it are dropped (parallel_tool_calls=false)."""
        self._tools = frozenset(tool_names) if tool_names is not None else None
        self._strict = strict
        self._new_id = new_id or self.default_id
        self._max_calls = max_calls
        self._fast = True
        self._buf = ""
        self._in_section = False
        self._raw: list[str] = []  # consumed markup not yet part of a call (for fallback)
        self._open: _OpenCall | None = None
        self._count = 0  # calls opened (the next index)
        self._after_calls = False  # drop whitespace right after tool markup
        self._content: list[str] = []
        self._deltas: list[ToolCallDelta] = []
        self.calls: list[ToolCall] = []

    default_id = staticmethod(openai_call_id)
    # A delta without any start marker's first character is all content: the one first
    # character the family's markers share, or a pattern of them (set per class).
    _first = ""
    _firsts: re.Pattern[str] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        firsts = sorted({m[0] for m in cls.start_markers})
        cls._first = firsts[0] if len(firsts) == 1 else ""
        cls._firsts = re.compile("[" + re.escape("".join(firsts)) + "]") if firsts else None

    # -- the public interface ------------------------------------------------------------

    def feed(self, text: str) -> ParsedDelta:
        if not self._buf and self._fast and not self._in_section and not self._after_calls:
            first = self._first
            if first:
                if first not in text:
                    return (text, "", ()) if text else EMPTY
            elif self._firsts is None or self._firsts.search(text) is None:
                return (text, "", ()) if text else EMPTY
        self._buf += text
        return self._drain(False)

    def finish(self) -> ParsedDelta:
        return self._drain(True)

    @property
    def called(self) -> bool:
        """Whether any tool call was emitted (finish_reason "tool_calls")."""
        call = self._open
        return bool(self.calls) or (call is not None and not self._strict and not call.ignored)

    @classmethod
    def parse_complete(
        cls,
        text: str,
        tool_names: Iterable[str] | None = None,
        *,
        new_id: Callable[[], str] | None = None,
        max_calls: int | None = None,
    ) -> ParsedOutput:
        """A whole output split into content and tool calls (strict policy)."""
        parser = cls(tool_names, strict=True, new_id=new_id, max_calls=max_calls)
        first = parser.feed(text)[0]
        last = parser.finish()[0]
        return ParsedOutput(first + last, "", tuple(parser.calls))

    # -- the loop ------------------------------------------------------------------------

    def _drain(self, final: bool) -> ParsedDelta:
        try:
            self._run(final)
        except Exception:  # a parser bug must not fail the request: the rest is content
            log.exception("tool-call parser %s failed; passing the text through", self.name)
            self._raw.append(self._buf)
            self._buf = ""
            self._give_up()
        content = "".join(self._content) if self._content else ""
        deltas = tuple(self._deltas)
        self._content.clear()
        self._deltas.clear()
        if not content and not deltas:
            return EMPTY
        return (content, "", deltas)

    def _run(self, final: bool) -> None:
        while True:
            if self._in_section:
                if not self._section(final):
                    if final and self._in_section:
                        self._fail()
                        continue
                    return
                continue
            buf = self._buf
            if not buf:
                return
            at, marker = self._find_start(buf, final)
            buf = self._buf  # a family may trim it (at is then relative to the new one)
            if at == -2:  # the family needs more text to decide
                return
            if at == -1:
                hold = 0 if final else partial_suffix_any(buf, self.start_markers)
                self._text(buf[: len(buf) - hold])
                self._buf = buf[len(buf) - hold :]
                return
            self._text(buf[:at])
            self._buf = buf[at + len(marker) :]
            self._raw = [marker]
            self._in_section = True
            self._begin_section(marker)

    def _find_start(self, buf: str, final: bool) -> tuple[int, str]:
        """Where the next start marker is: (index, marker), (-1, "") for none, (-2, "")
        to hold all of `buf` until more text arrives. It may replace `self._buf` by a
        suffix of it (the index is then relative to that)."""
        return find_first(buf, self.start_markers)

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._after_calls:
            text = text.lstrip(WHITESPACE)
            if not text:
                return
            self._after_calls = False
        self._content.append(text)

    # -- what a family calls -------------------------------------------------------------

    def _begin_section(self, marker: str) -> None:
        """Called after a start marker was consumed (the family resets its state)."""

    def _section(self, final: bool) -> bool:
        """Consume markup from `self._buf`; False when more text is needed."""
        raise NotImplementedError

    def _consume(self, n: int) -> None:
        self._raw.append(self._buf[:n])
        self._buf = self._buf[n:]

    def _open_call(self, name: str, call_id: str | None = None) -> bool:
        """A call's name is read: False when it is not one of the request's tools."""
        if self._tools is not None and name not in self._tools:
            return False
        ignored = self._max_calls is not None and self._count >= self._max_calls
        call = _OpenCall(self._count, call_id or self._new_id(), name, ignored)
        self._count += 1
        self._open = call
        if not self._strict:
            self._raw.clear()  # announced: this markup will not fall back any more
            if not ignored:
                self._deltas.append(ToolCallDelta(call.index, call.id, name, ""))
        return True

    def _args(self, fragment: str) -> None:
        """Argument text of the open call, as it arrives."""
        call = self._open
        if call is None or not fragment:
            return
        call.parts.append(fragment)
        if not self._strict and not call.ignored:
            self._deltas.append(ToolCallDelta(call.index, None, None, fragment))

    def _close_call(self, tail: str = "", arguments: str | None = None, check: bool = True) -> bool:
        """The open call is complete: `tail` is its last argument text, or `arguments` all
        of it. False (strict policy) when the arguments are not valid JSON, unless `check`
        is false (a call whose arguments are whatever the output holds, valid or not)."""
        call = self._open
        if call is None:
            return False
        if arguments is None:
            if tail:
                call.parts.append(tail)
            arguments = "".join(call.parts)
            fresh = tail
        else:
            fresh = arguments
        if self._strict:
            if check:
                try:
                    json.loads(arguments)
                except ValueError:
                    return False
            if not call.ignored:
                self._deltas.append(ToolCallDelta(call.index, call.id, call.name, ""))
                if arguments:
                    self._deltas.append(ToolCallDelta(call.index, None, None, arguments))
        elif fresh and not call.ignored:
            self._deltas.append(ToolCallDelta(call.index, None, None, fresh))
        if not call.ignored:
            self.calls.append(ToolCall(call.id, call.name, arguments))
        self._open = None
        self._raw.clear()
        self._after_calls = True
        return True

    def _end_section(self) -> None:
        if self._open is not None:
            if self._strict:
                self._fail()
                return
            self._close_call()  # announced, never closed: it keeps what it has
        self._in_section = False
        self._raw.clear()
        if self.calls:
            self._after_calls = True

    def _fail(self) -> None:
        """Markup that does not follow the format: an announced call keeps what it has;
        markup not yet part of a call becomes content; the rest is read as text again."""
        call = self._open
        if call is not None:
            if self._strict:
                self._count = call.index  # never announced: its index is free again
            else:
                self._close_call()
        self._open = None
        self._give_up()

    def _give_up(self) -> None:
        raw = "".join(self._raw)
        self._raw.clear()
        self._in_section = False
        self._open = None
        if raw:
            self._after_calls = False
            self._content.append(raw)
