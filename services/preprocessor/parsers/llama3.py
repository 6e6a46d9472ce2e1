"""Llama 3.x JSON tool calls (vLLM llama3_json, SGLang llama3): the whole reply is one or
more JSON objects separated by ";", optionally after the <|python_tag|> token:

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

Without the tag, a reply is read as calls only when it begins with "{" (after whitespace),
as the engines do; a JSON reply that is not a call of a known tool stays content.
`<|python_tag|>` is a special token of the Llama 3 vocabulary.
"""

from __future__ import annotations

from .json_calls import JsonObjectsParser
from .scan import WHITESPACE, find_first

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(JsonObjectsParser):
    name = "llama3_json"
    start_markers: tuple[str, ...] = (PYTHON_TAG,)
    needs_special_tokens = True

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
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

    def _after(self, final: bool) -> bool:
        buf = self._buf
        rest = buf.lstrip(WHITESPACE)
        if rest.startswith(";"):
            self._consume(len(buf) - len(rest) + 1)
            self._next_object()
            return True
        if not rest and not final:
            return False
        self._end_section()  # the calls ended; anything after them is text
        return True
