"""Mistral tool calls (vLLM mistral, SGLang mistral), in both forms the models use:

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]
        (the JSON list of Mistral 7B v0.3 and tokenizers before v11)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}
        (tokenizer v11 and later: Mistral Small 3.2, Magistral, Devstral; some versions put
        [CALL_ID]<id> before [ARGS])

`[TOOL_CALLS]` / `[ARGS]` are control tokens (skip_special_tokens drops them). Mistral's
templates insist on 9-character alphanumeric tool call ids, so the ids made here are so.
"""

from __future__ import annotations

import secrets
import string

from .json_calls import JsonCallsParser, Read
from .scan import WHITESPACE, JsonEnd

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
MAX_NAME = 256

_ALPHANUMERIC = string.ascii_letters + string.digits

_LEAD, _ITEM, _OBJECT, _ITEM_END, _NAME, _ARGS_LEAD, _ARGS = range(7)


def mistral_call_id() -> str:
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))


class MistralToolParser(JsonCallsParser):
    name = "mistral"
    start_markers: tuple[str, ...] = (TOOL_CALLS,)
    needs_special_tokens = True
    default_id = staticmethod(mistral_call_id)

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._state = _LEAD
        self._value: JsonEnd | None = None
        self._sent = 0

    def _begin_section(self, marker: str) -> None:
        self._state = _LEAD

    def _section(self, final: bool) -> bool:
        buf = self._buf
        state = self._state
        if state in (_LEAD, _ITEM, _ITEM_END, _ARGS_LEAD):
            rest = buf.lstrip(WHITESPACE)
            if not rest:
                if not final:
                    return False
                if state == _ITEM_END:
                    self._end_section()  # the list was cut off after a complete call
                elif state == _ITEM:  # cut off before the next item: the family decides
                    if self._cut_off() is Read.DONE:
                        self._end_section()
                else:
                    self._fail()
                return True
            skipped = len(buf) - len(rest)
            first = rest[0]
            if state == _LEAD:
                if first == "[":
                    self._consume(skipped + 1)
                    self._state = _ITEM
                else:
                    self._consume(skipped)
                    self._state = _NAME
                return True
            if state == _ITEM:
                if first == "{":
                    self._consume(skipped)
                    self._state = _OBJECT
                elif first == "]":
                    self._consume(skipped + 1)
                    self._end_section()
                else:
                    self._fail()
                return True
            if state == _ITEM_END:
                if first == ",":
                    self._consume(skipped + 1)
                    self._state = _ITEM
                elif first == "]":
                    self._consume(skipped + 1)
                    self._end_section()
                else:
                    self._end_section()  # no closing bracket: what follows is text
                return True
            # _ARGS_LEAD
            if first not in "{[":
                self._fail()
                return True
            self._consume(skipped)
            self._value = JsonEnd(0)
            self._sent = 0
            self._state = _ARGS
            return True
        if state == _OBJECT:
            read = self._read_object(final)
            if read is Read.WAIT:
                return False
            if read is Read.DONE:
                self._state = _ITEM_END
            return True
        if state == _NAME:
            at = buf.find(ARGS)
            if at == -1:
                if final or len(buf) > MAX_NAME:
                    self._fail()
                    return True
                return False
            name = buf[:at].partition(CALL_ID)[0].strip()
            if not name or any(c in WHITESPACE for c in name) or not self._open_call(name):
                self._fail()
                return True
            self._consume(at + len(ARGS))
            self._state = _ARGS_LEAD
            return True
        # _ARGS: the compact form's arguments end where their JSON value ends
        value = self._value
        assert value is not None
        end = value.scan(buf)
        upto = end if end != -1 else len(buf)
        if not self._strict and upto > self._sent:
            self._args(buf[self._sent : upto])
            self._sent = upto
        if end == -1 and not final:
            return False
        self._consume(upto)
        if self._close_call(buf[:upto] if self._strict else ""):
            self._end_section()
        else:
            self._fail()
        return True
