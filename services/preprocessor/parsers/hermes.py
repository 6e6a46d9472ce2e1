"""Hermes-style tool calls, used by Qwen 2.5 / Qwen3 and Hermes 2 Pro / 3 (vLLM hermes,
SGLang qwen25): one JSON object per <tool_call> block, blocks one after another:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": ...}
    </tool_call>

`<tool_call>` / `</tool_call>` are added, non-special tokens of the Qwen vocabulary. A
missing `</tool_call>` after a complete object (the model stopped there) is tolerated.
The XML argument format of Qwen3-Coder (`<function=...><parameter=...>`) is not this
one: it falls back to content.
"""

from __future__ import annotations

from .json_calls import JsonCallsParser, Read
from .scan import WHITESPACE

BEGIN = "<tool_call>"
END = "</tool_call>"

_LEAD, _OBJECT, _TAIL = range(3)


class HermesToolParser(JsonCallsParser):
    name = "hermes"
    start_markers: tuple[str, ...] = (BEGIN,)

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._state = _LEAD

    def _begin_section(self, marker: str) -> None:
        self._state = _LEAD

    def _section(self, final: bool) -> bool:
        buf = self._buf
        if self._state == _LEAD:
            rest = buf.lstrip(WHITESPACE)
            if not rest:
                if final:
                    self._fail()
                    return True
                return False
            if rest[0] != "{":
                self._fail()
                return True
            self._consume(len(buf) - len(rest))
            self._state = _OBJECT
            return True
        if self._state == _OBJECT:
            read = self._read_object(final)
            if read is Read.WAIT:
                return False
            if read is Read.DONE:
                self._state = _TAIL
            return True
        rest = buf.lstrip(WHITESPACE)
        if rest.startswith(END):
            self._consume(len(buf) - len(rest) + len(END))
            self._end_section()
            return True
        if not final and END.startswith(rest):
            return False
        self._end_section()  # no </tool_call>: what follows is text again
        return True
