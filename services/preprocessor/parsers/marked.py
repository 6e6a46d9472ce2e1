"""Tool calls framed by marker tokens: DeepSeek V3 / V3.1 / R1 and Kimi-K2 share this shape.

    <section>  ( <call> header <header_end> arguments <call_end> )*  <section_end>

The section may also start at a bare <call> marker; whitespace between calls is allowed; a
missing <section_end> (or <call_end> after complete JSON) at the end of the output is
tolerated. Arguments stream as they arrive, minus a held-back tail that could be the start
of <call_end> (or of characters stripped before it, such as DeepSeek-V3's closing fence).
"""

from __future__ import annotations

from .scan import WHITESPACE, partial_suffix
from .tool_stream import ToolParser

MAX_HEADER = 512

_BETWEEN, _HEADER, _ARGS_LEAD, _ARGS = range(4)


class MarkedToolParser(ToolParser):
    section_begin = ""
    section_end = ""
    call_begin = ""
    header_end = ""
    call_end = ""
    # Characters stripped from the end of the arguments (before <call_end>).
    args_trailer = WHITESPACE

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._state = _BETWEEN
        self._scan = 0  # where the search for the next marker resumes in self._buf

    def parse_header(self, header: str) -> tuple[str, str | None] | None:
        """(name, call id from the markup or None) from the text before <header_end>."""
        raise NotImplementedError

    def _begin_section(self, marker: str) -> None:
        self._state = _HEADER if marker == self.call_begin else _BETWEEN
        self._scan = 0

    def _section(self, final: bool) -> bool:
        state = self._state
        buf = self._buf
        if state == _BETWEEN:
            rest = buf.lstrip(WHITESPACE)
            skipped = len(buf) - len(rest)
            if rest.startswith(self.call_begin):
                self._consume(skipped + len(self.call_begin))
                self._state = _HEADER
                self._scan = 0
                return True
            if rest.startswith(self.section_end):
                self._consume(skipped + len(self.section_end))
                self._end_section()
                return True
            if not rest and final and self.calls:
                self._end_section()  # the output ended after a call, without <section_end>
                return True
            if not final and (
                self.call_begin.startswith(rest) or self.section_end.startswith(rest)
            ):
                return False
            self._fail()
            return True
        if state == _HEADER:
            at = buf.find(self.header_end, self._scan)
            if at == -1:
                if final or len(buf) > MAX_HEADER:
                    self._fail()
                    return True
                self._scan = max(0, len(buf) - len(self.header_end) + 1)
                return False
            parsed = self.parse_header(buf[:at])
            if parsed is None or not self._open_call(*parsed):
                self._fail()
                return True
            self._consume(at + len(self.header_end))
            self._state = _ARGS_LEAD
            return True
        if state == _ARGS_LEAD:
            rest = buf.lstrip(WHITESPACE)
            if rest:
                self._consume(len(buf) - len(rest))
                self._state = _ARGS
                self._scan = 0
                return True
            self._consume(len(buf))
            if final:
                return self._close_or_fail("")
            return False
        # _ARGS
        end = self.call_end
        at = buf.find(end, self._scan)
        if at != -1:
            tail = buf[:at].rstrip(self.args_trailer)
            self._consume(at + len(end))
            if not self._close_call(tail):
                self._fail()
                return True
            self._state = _BETWEEN
            return True
        if final:
            tail = buf.rstrip(self.args_trailer)
            self._consume(len(buf))
            return self._close_or_fail(tail)
        if self._strict:
            self._scan = max(0, len(buf) - len(end) + 1)
            return False
        hold = partial_suffix(buf, end)
        ready = len(buf[: len(buf) - hold].rstrip(self.args_trailer))
        if ready:
            self._args(buf[:ready])
            self._buf = buf[ready:]
        return False

    def _close_or_fail(self, tail: str) -> bool:
        """The output ended inside a call: complete JSON makes it a call, else it fails."""
        if self._close_call(tail):
            self._end_section()
        else:
            self._fail()
        return True
