"""Output parsers: tool calls and reasoning split from the model's text, streaming and not.

Layout: types (events), scan (markers, JSON spans), tool_stream (the shared machinery),
marked / json_calls (two shapes of markup), deepseek, kimi_k2, hermes, llama3, mistral,
constrained (tool_choice output), reasoning, output (reasoning + tools per choice),
registry (names, the guess per model), constraints (tool_choice -> engine constraint).

Use: `choice = parsers_for(config_json, chat_template, flag_tool, flag_reasoning)` once per
model; per choice `parser = choice.for_request(prompt=<rendered prompt>, tools=...,
tool_choice=..., parallel_tool_calls=..., chat_template_kwargs=...)`, then
`content, reasoning, tool_calls = feed(delta)` per detokenized delta (`feed =
parser.feeder()`, after stop strings) and `parser.finish()` at the end; not streaming,
`strict=True` and `parser.parse(text)`. Around it: detokenize with skip_special_tokens
false when `choice.needs_special_tokens`; finish_reason "tool_calls" when `parser.called`
(unless the output was cut by max_tokens); a delta fed while `parser.in_reasoning` counts
its tokens as reasoning_tokens; `tool_choice_constraint(...)` gives the engine constraint
for required / named tool_choice (start it after the reasoning when a reasoning parser is
active).
"""

from .constraints import Constraint, tool_choice_constraint
from .output import OutputParser
from .registry import ParserChoice, UnknownParserError, parsers_for
from .types import EMPTY, ParsedDelta, ParsedOutput, ToolCall, ToolCallDelta

__all__ = [
    "EMPTY",
    "Constraint",
    "OutputParser",
    "ParsedDelta",
    "ParsedOutput",
    "ParserChoice",
    "ToolCall",
    "ToolCallDelta",
    "UnknownParserError",
    "parsers_for",
    "tool_choice_constraint",
]
