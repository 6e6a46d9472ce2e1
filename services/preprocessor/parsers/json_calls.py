"""Tool calls written as JSON objects: {"name": ..., "arguments" | "parameters": {...}}.

Shared by the Hermes/Qwen, Llama 3 and Mistral (list form) parsers and by the parser of
`tool_choice: required` output. A family positions `self._buf` at the object's `{` and
calls `_read_object`. When the object opens the streaming way (name first, arguments an
object or array) the call is announced at once and its arguments stream as raw JSON text;
otherwise (other key order, arguments given as a string) the whole object is awaited and
read with json.loads. The arguments are the model's own text of the value in the first
case, and its JSON dump (or the string itself) in the second, under both policies.
"""

from __future__ import annotations

import json
from enum import Enum

from .scan import WHITESPACE, Header, JsonEnd, match_header
from .tool_stream import ToolParser


class Read(Enum):
    WAIT = 0  # more text needed
    DONE = 1  # the object was read (a call, or an ignored one)
    FAILED = 2  # not a call: fell back to content


class JsonCallsParser(ToolParser):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._object: JsonEnd | None = None
        self._header: Header | bool = True  # True: undecided; False: await the object
        self._args_scan: JsonEnd | None = None
        self._emitted = 0

    def _read_object(self, final: bool) -> Read:
        buf = self._buf
        if self._object is None:
            self._object = JsonEnd(0)
            self._header = True
            self._args_scan = None
            self._emitted = 0
        if self._header is True and not self._strict:
            header = match_header(buf)
            if isinstance(header, Header):
                if buf[header.args_start] in "{[":
                    if not self._open_call(header.name):
                        return self._failed()
                    self._args_scan = JsonEnd(header.args_start)
                    self._emitted = header.args_start
                    self._header = header
                else:
                    self._header = False
            elif header is False:
                self._header = False
        scan = self._args_scan
        if scan is not None:
            end = scan.scan(buf)
            upto = end if end != -1 else scan.pos
            if upto > self._emitted:
                self._args(buf[self._emitted : upto])
                self._emitted = upto
            if end != -1:
                self._args_scan = None  # the value is complete; the object closes next
        end = self._object.scan(buf)
        if end == -1:
            return self._cut_off() if final else Read.WAIT
        body = buf[:end]
        self._consume(end)
        self._object = None
        if self._open is not None and not self._strict:
            self._close_call()
            return Read.DONE
        return self._whole(body)

    def _cut_off(self) -> Read:
        """The output ended inside the object (max_tokens cut it). Progressive: a call
        already announced keeps what it has; otherwise the object is not a call."""
        if self._open is not None and not self._strict:
            self._consume(len(self._buf))
            self._close_call()
            self._object = None
            return Read.DONE
        return self._failed()

    def _whole(self, body: str) -> Read:
        try:
            obj = json.loads(body)
        except ValueError:
            return self._failed()
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return self._failed()
        if "arguments" in obj:
            args = obj["arguments"]
        else:
            args = obj.get("parameters", {})
        header = match_header(body)
        if isinstance(header, Header) and body[header.args_start] in "{[":
            start = header.args_start
            text = body[start : JsonEnd(start).scan(body)]
        elif isinstance(args, str):
            text = args
        else:
            text = json.dumps(args, ensure_ascii=False)
        if not self._open_call(obj["name"]) or not self._close_call(arguments=text):
            return self._failed()
        return Read.DONE

    def _failed(self) -> Read:
        self._object = None
        self._args_scan = None
        self._fail()
        return Read.FAILED


# The states of a section that is JSON objects in a row (Hermes, Llama 3): whitespace, an
# object, then what the family expects after one (a closing tag, a separator).
_LEAD, _OBJECT, _AFTER = range(3)


class JsonObjectsParser(JsonCallsParser):
    """A section of calls, each a JSON object after optional whitespace. The family reads
    what follows an object in `_after` and returns to the lead with `_next_object`."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._state = _LEAD

    def _begin_section(self, marker: str) -> None:
        self._state = _LEAD

    def _next_object(self) -> None:
        self._state = _LEAD

    def _section(self, final: bool) -> bool:
        if self._state == _AFTER:
            return self._after(final)
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
        read = self._read_object(final)
        if read is Read.WAIT:
            return False
        if read is Read.DONE:
            self._state = _AFTER
        return True

    def _after(self, final: bool) -> bool:
        """One step past a complete object (the `_section` contract: True to step again,
        False to wait for more text)."""
        raise NotImplementedError
