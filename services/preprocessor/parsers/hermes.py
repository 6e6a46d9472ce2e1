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

from .json_calls import JsonObjectsParser
from .scan import WHITESPACE

BEGIN = "<tool_call>"
END = "</tool_call>"


class HermesToolParser(JsonObjectsParser):
    name = "hermes"
    start_markers: tuple[str, ...] = (BEGIN,)

    def _after(self, final: bool) -> bool:
        buf = self._buf
        rest = buf.lstrip(WHITESPACE)
        if rest.startswith(END):
            self._consume(len(buf) - len(rest) + len(END))
            self._end_section()
            return True
        if not final and END.startswith(rest):
            return False
        self._end_section()  # no </tool_call>: what follows is text again
        return True
