"""Llama 3.x JSON tool calls (vLLM llama3_json, SGLang llama3): the whole reply is one or
more JSON objects separated by ";", optionally after the <|python_tag|> token:

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

Without the tag, a reply is read as calls only when it begins with "{" (after whitespace),
as the engines do; a JSON reply that is not a call of a known tool stays content.
`<|python_tag|>` is a special token of the Llama 3 vocabulary.
"""

from __future__ import annotations

from .json_calls import JsonCallsParser, Read
from .scan import WHITESPACE, find_first

PYTHON_TAG = "<|python_tag|>"

_LEAD, _OBJECT, _SEPARATOR = range(3)


class Llama3JsonToolParser(JsonCallsParser):
    name = "llama3_json"
    start_markers: tuple[str, ...] = (PYTHON_TAG,)
    needs_special_tokens = True

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._state = _LEAD
        self._fast = False  # until the reply's first character is known
        self._decided = False

    def _find_start(self, buf: str, final: bool) -> tuple[int, str]:
        if not self._decided:
            rest = buf.lstrip(WHITESPACE)
            if not rest and not final:
                return -2, ""
            self._decided = True
            self._fast = True
            if rest.startswith("{"):
                self._buf = rest  # leading whitespace of a calls-only reply is dropped
                return 0, ""
        return find_first(buf, self.start_markers)

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
                self._state = _SEPARATOR
            return True
        rest = buf.lstrip(WHITESPACE)
        if rest.startswith(";"):
            self._consume(len(buf) - len(rest) + 1)
            self._state = _LEAD
            return True
        if not rest and not final:
            return False
        self._end_section()  # the calls ended; anything after them is text
        return True
