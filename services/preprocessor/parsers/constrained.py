"""Reading the output of a tool_choice constraint back as tool calls (see constraints.py).

- `tool_choice: "required"`: the engine was constrained to a JSON list of
  {"name": ..., "parameters": {...}} objects (at least one; one when parallel_tool_calls is
  false); each item is a call. The list streams item by item, arguments as they arrive.
  A list cut off by max_tokens keeps its complete calls, and its last call once that call's
  name and the start of its arguments were read (its arguments as far as they got, as
  vLLM streams them); an item cut off before that is dropped. Streamed or not, the list's
  own syntax never becomes content.
- a named function: the engine was constrained to that function's parameters schema; the
  whole output is the arguments of one call of it, whether or not they are complete JSON
  (vLLM's `arguments=content`), so a cut-off output is a call with truncated arguments.
No markup is involved, so these parsers serve every model family. A required output that
is not a list (an engine that ignored the constraint) falls back to content.
"""

from __future__ import annotations

from collections.abc import Callable

from .json_calls import Read
from .mistral import _ITEM, MistralToolParser
from .scan import WHITESPACE, Header, JsonEnd, match_header
from .tool_stream import ToolParser, openai_call_id


class RequiredToolParser(MistralToolParser):
    """The JSON list of calls that `tool_choice: "required"` constrains the output to."""

    name = "required"
    start_markers: tuple[str, ...] = ()
    needs_special_tokens = False
    default_id = staticmethod(openai_call_id)

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._fast = False
        self._decided = False

    def _find_start(self, buf: str, final: bool) -> tuple[int, str]:
        if self._decided:
            return -1, ""
        rest = buf.lstrip(WHITESPACE)
        if not rest and not final:
            return -2, ""
        self._decided = True
        if not rest.startswith("["):
            return -1, ""
        self._buf = rest[1:]
        return 0, ""

    def _begin_section(self, marker: str) -> None:
        self._raw = ["["]
        self._state = _ITEM

    def _cut_off(self) -> Read:
        """The output ended inside the list (max_tokens): the item being read is a call
        once its header is read and its arguments began, under both policies (the
        progressive one announced it already); before that it is dropped."""
        if self._open is not None and not self._strict:
            return super()._cut_off()
        buf = self._buf
        header = match_header(buf)
        if isinstance(header, Header) and buf[header.args_start] in "{[":
            if not self._open_call(header.name):
                return self._failed()
            scan = JsonEnd(header.args_start)  # the text the progressive policy streamed
            scan.scan(buf)
            self._close_call(arguments=buf[header.args_start : scan.pos], check=False)
        self._consume(len(buf))
        self._object = None
        return Read.DONE


class NamedToolParser(ToolParser):
    """The arguments of the one function a named tool_choice constrains the output to."""

    name = "named"

    def __init__(
        self,
        function: str,
        *,
        strict: bool = False,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        super().__init__([function], strict=strict, new_id=new_id, max_calls=1)
        self._function = function
        self._fast = False
        self._decided = False

    def _find_start(self, buf: str, final: bool) -> tuple[int, str]:
        if self._decided:
            return -1, ""
        rest = buf.lstrip(WHITESPACE)
        if not rest and not final:
            return -2, ""
        self._decided = True
        self._buf = rest
        return 0, ""

    def _begin_section(self, marker: str) -> None:
        self._open_call(self._function)

    def _section(self, final: bool) -> bool:
        buf = self._buf
        if final:
            self._consume(len(buf))
            self._close_call(buf.rstrip(WHITESPACE), check=False)  # complete or not
            self._end_section()
            return True
        if not self._strict:
            ready = len(buf.rstrip(WHITESPACE))
            if ready:
                self._args(buf[:ready])
                self._buf = buf[ready:]
        return False
