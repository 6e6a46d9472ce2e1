"""Reading the output of a tool_choice constraint back as tool calls (see constraints.py).

- `tool_choice: "required"`: the engine was constrained to a JSON list of
  {"name": ..., "parameters": {...}} objects (at least one; one when parallel_tool_calls is
  false); each item is a call. The list streams item by item, arguments as they arrive.
- a named function: the engine was constrained to that function's parameters schema; the
  whole output is the arguments of one call of it.
No markup is involved, so these parsers serve every model family. Output that does not
have the constrained shape (an engine that ignored the constraint) falls back to content.
"""

from __future__ import annotations

from collections.abc import Callable

from .mistral import _ITEM, MistralToolParser
from .scan import WHITESPACE
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
            if self._close_call(buf.rstrip(WHITESPACE)):
                self._end_section()
            else:
                self._fail()
            return True
        if not self._strict:
            ready = len(buf.rstrip(WHITESPACE))
            if ready:
                self._args(buf[:ready])
                self._buf = buf[ready:]
        return False
