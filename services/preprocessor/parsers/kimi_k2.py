"""Kimi-K2 tool calls (Moonshot's tool_call_guidance; vLLM kimi_k2, SGLang kimi_k2):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
    {"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.NAME:1...
    <|tool_calls_section_end|>    (one line in the output)

The markup's `functions.NAME:IDX` is the call's id: Kimi's template writes it back in the
history (`<|tool_call_begin|>{{ id }}` and "## Return of {{ tool_call_id }}"), so it is kept
as the OpenAI tool call id. The markers are special tokens of Kimi's vocabulary.
"""

from __future__ import annotations

import re

from .marked import MarkedToolParser

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

_CALL_ID = re.compile(r"(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)")


class KimiK2ToolParser(MarkedToolParser):
    name = "kimi_k2"
    start_markers: tuple[str, ...] = (SECTION_BEGIN, CALL_BEGIN)
    needs_special_tokens = True
    section_begin = SECTION_BEGIN
    section_end = SECTION_END
    call_begin = CALL_BEGIN
    header_end = ARGUMENT_BEGIN
    call_end = CALL_END

    def parse_header(self, header: str) -> tuple[str, str | None] | None:
        call_id = header.strip()
        m = _CALL_ID.fullmatch(call_id)
        if m is None:
            return None
        return m.group("name"), call_id
