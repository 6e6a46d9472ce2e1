"""DeepSeek tool calls: V3 and R1 (one format) and V3.1 (another), from the models' own
templates and the engines' parsers (vLLM deepseek_v3 / deepseek_v31, SGLang deepseekv3 /
deepseekv31).

V3 / R1 (the type, then the name, then the arguments in a json code fence):
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>
V3.1 (no type, no fence; calls chained without separators):
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>    (one line in the output)
The markers are single tokens of the DeepSeek vocabulary, not special ones: they survive a
detokenizer that skips special tokens.
"""

from __future__ import annotations

from .marked import MarkedToolParser
from .scan import WHITESPACE

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
FENCE = "```json"


class DeepSeekV3ToolParser(MarkedToolParser):
    name = "deepseek_v3"
    start_markers: tuple[str, ...] = (CALLS_BEGIN, CALL_BEGIN)
    section_begin = CALLS_BEGIN
    section_end = CALLS_END
    call_begin = CALL_BEGIN
    header_end = FENCE
    call_end = CALL_END
    args_trailer = WHITESPACE + "`"  # the closing fence before <｜tool▁call▁end｜>

    def parse_header(self, header: str) -> tuple[str, str | None] | None:
        kind, sep, name = header.partition(SEP)
        name = name.strip()
        if not sep or not name or kind.strip() not in ("function", ""):
            return None
        return name, None


class DeepSeekV31ToolParser(MarkedToolParser):
    name = "deepseek_v31"
    start_markers: tuple[str, ...] = (CALLS_BEGIN, CALL_BEGIN)
    section_begin = CALLS_BEGIN
    section_end = CALLS_END
    call_begin = CALL_BEGIN
    header_end = SEP
    call_end = CALL_END

    def parse_header(self, header: str) -> tuple[str, str | None] | None:
        name = header.strip()
        return (name, None) if name else None
