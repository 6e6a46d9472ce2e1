"""Which parsers a model gets: by name (a flag), or guessed from its files.

`parsers_for(config_json, chat_template, override_tool, override_reasoning)` returns a
`ParserChoice` for the model, once per model; `ParserChoice.for_request(...)` makes the
per-choice `OutputParser`. Names follow the engines' own flags (vLLM's
`--tool-call-parser` / `--reasoning-parser`, SGLang's spellings accepted as aliases), plus
"none" to switch a parser off.

The guess reads the chat template first, since the markup a model writes is what its
template teaches (DeepSeek-V3, R1 and V3.1 share `model_type` "deepseek_v3"; Kimi-K2 has
DeepSeek-V3's architecture), then falls back to config.json's `model_type` and
`architectures`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .constrained import NamedToolParser, RequiredToolParser
from .deepseek import CALLS_BEGIN, DeepSeekV3ToolParser, DeepSeekV31ToolParser
from .hermes import HermesToolParser
from .kimi_k2 import KimiK2ToolParser
from .llama3 import Llama3JsonToolParser
from .mistral import MistralToolParser
from .output import OutputParser
from .reasoning import ReasoningFormat
from .tool_stream import ToolParser

NONE = "none"

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "deepseek_v3": DeepSeekV3ToolParser,
    "deepseek_r1": DeepSeekV3ToolParser,  # R1 (0528) writes V3's markup
    "deepseek_v31": DeepSeekV31ToolParser,
    "hermes": HermesToolParser,
    "qwen25": HermesToolParser,
    "qwen3": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "kimi_k2": KimiK2ToolParser,
}
_TOOL_ALIASES = {"deepseekv3": "deepseek_v3", "deepseekv31": "deepseek_v31", "qwen": "qwen25",
                 "llama3": "llama3_json", "kimik2": "kimi_k2"}  # fmt: skip

REASONING_FORMATS: dict[str, ReasoningFormat] = {
    # R1 reasons first whether or not its template opens the block.
    "deepseek_r1": ReasoningFormat("deepseek_r1", forced=True, exits=(CALLS_BEGIN,)),
    # V3.1 reasons only when thinking is switched on (chat_template_kwargs thinking): its
    # template then opens the block (and closes it when off).
    "deepseek_v31": ReasoningFormat("deepseek_v31", by_switch=True, exits=(CALLS_BEGIN,)),
    "qwen3": ReasoningFormat("qwen3"),
    "kimi_k2": ReasoningFormat("kimi_k2"),
}
_REASONING_ALIASES = {"deepseek_v3": "deepseek_v31", "qwen3_thinking": "qwen3", "kimi": "kimi_k2"}


_THINKING_SWITCH = re.compile(r"\bthinking\b")  # V3.1's template variable (not enable_thinking)


class UnknownParserError(ValueError):
    pass


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def tool_parser_class(name: str) -> type[ToolParser] | None:
    """The parser class for a flag value; None for "none"; raises on an unknown name."""
    key = _key(name)
    if key == NONE:
        return None
    key = _TOOL_ALIASES.get(key, key)
    if key not in TOOL_PARSERS:
        raise UnknownParserError(
            f"unknown tool-call parser {name!r}; known: {', '.join(sorted(TOOL_PARSERS))}, none"
        )
    return TOOL_PARSERS[key]


def reasoning_format(name: str) -> ReasoningFormat | None:
    key = _key(name)
    if key == NONE:
        return None
    key = _REASONING_ALIASES.get(key, key)
    if key not in REASONING_FORMATS:
        known = ", ".join(sorted(REASONING_FORMATS))
        raise UnknownParserError(f"unknown reasoning parser {name!r}; known: {known}, none")
    return REASONING_FORMATS[key]


@dataclass(frozen=True, slots=True)
class ParserChoice:
    """The parsers of one model; `for_request` makes a choice's OutputParser."""

    tool: type[ToolParser] | None
    reasoning: ReasoningFormat | None

    @property
    def needs_special_tokens(self) -> bool:
        """Detokenize with skip_special_tokens=False when tools are parsed (the family's
        markers are special tokens, e.g. Mistral's [TOOL_CALLS])."""
        return self.tool is not None and self.tool.needs_special_tokens

    def for_request(
        self,
        *,
        prompt: str = "",
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        strict: bool = False,
        new_id: Callable[[], str] | None = None,
    ) -> OutputParser:
        """`prompt`: the rendered prompt (where the output starts decides the reasoning
        mode); `tools` / `tool_choice` / `parallel_tool_calls`: as the request gave them;
        `strict`: tool calls only once complete and valid (non-streaming)."""
        reasoning = (
            self.reasoning.parser(prompt, chat_template_kwargs)
            if self.reasoning is not None
            else None
        )
        return OutputParser(
            reasoning,
            tool_parser(self.tool, tools, tool_choice, parallel_tool_calls, strict, new_id),
        )


def tool_parser(
    family: type[ToolParser] | None,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: str | Mapping[str, Any] | None,
    parallel_tool_calls: bool = True,
    strict: bool = False,
    new_id: Callable[[], str] | None = None,
) -> ToolParser | None:
    """The tool parser for a request: the family's for `auto`, the constrained output's
    for `required` and a named function, none without tools or for `none`."""
    if not tools or tool_choice == "none":
        return None
    names = tool_names(tools)
    max_calls = None if parallel_tool_calls else 1
    if tool_choice == "required":
        return RequiredToolParser(names, strict=strict, new_id=new_id, max_calls=max_calls)
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str):
            return NamedToolParser(name, strict=strict, new_id=new_id)
    if family is None:
        return None
    return family(names, strict=strict, new_id=new_id, max_calls=max_calls)


def tool_names(tools: Iterable[Mapping[str, Any]]) -> list[str]:
    names = []
    for tool in tools:
        function = tool.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            names.append(function["name"])
    return names


def parsers_for(
    config_json: Mapping[str, Any] | None,
    chat_template: str | None,
    override_tool: str | None = None,
    override_reasoning: str | None = None,
) -> ParserChoice:
    """The model's parsers: the overrides (flag values) where given, else the guess."""
    config = config_json or {}
    template = chat_template or ""
    tool = (
        tool_parser_class(override_tool)
        if override_tool is not None
        else TOOL_PARSERS.get(guess_tool_parser(config, template) or "")
    )
    if override_reasoning is not None:
        reasoning = reasoning_format(override_reasoning)
    else:
        guessed = guess_reasoning_parser(config, template)
        reasoning = REASONING_FORMATS[guessed] if guessed else None
    return ParserChoice(tool, reasoning)


_MODEL_TYPES = {
    "deepseek_v3": "deepseek_v3",
    "deepseek_v2": "deepseek_v3",
    "kimi_k2": "kimi_k2",
    "qwen2": "hermes",
    "qwen2_moe": "hermes",
    "qwen3": "hermes",
    "qwen3_moe": "hermes",
    "qwen3_next": "hermes",
    "mistral": "mistral",
    "mixtral": "mistral",
    "mistral3": "mistral",
    "llama": "llama3_json",
    "llama4": "llama4_json",
}
_ARCHITECTURES = {
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV2ForCausalLM": "deepseek_v3",
    "Qwen2ForCausalLM": "hermes",
    "Qwen2MoeForCausalLM": "hermes",
    "Qwen3ForCausalLM": "hermes",
    "Qwen3MoeForCausalLM": "hermes",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mistral",
    "LlamaForCausalLM": "llama3_json",
}


def guess_tool_parser(config: Mapping[str, Any], template: str) -> str | None:
    """A tool parser name from the template's markup, else from config.json; None."""
    if "<|tool_calls_section_begin|>" in template or "<|tool_call_begin|>" in template:
        return "kimi_k2"
    if CALLS_BEGIN in template or "<｜tool▁call▁begin｜>" in template:
        # V3 / R1 put the arguments in a json fence after the type; V3.1 writes them bare.
        return "deepseek_v3" if "```json" in template else "deepseek_v31"
    if "<tool_call>" in template:
        # Qwen3-Coder's XML arguments (<function=...>) are another format: not guessed.
        return None if "<function=" in template else "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template:
        return "llama3_json"
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    for arch in config.get("architectures") or ():
        if arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch]
    return None


def guess_reasoning_parser(config: Mapping[str, Any], template: str) -> str | None:
    """A reasoning parser name when the template knows think blocks; None otherwise."""
    if "<think>" not in template and "</think>" not in template:
        return None
    model_type = str(config.get("model_type") or "")
    if "<|im_middle|>" in template or model_type == "kimi_k2":
        return "kimi_k2"
    # The template's own markup first (a DeepSeek-architecture model with a ChatML template
    # thinks the way that template says), then config.json.
    deepseek = "<｜Assistant｜>" in template
    if not deepseek and "<|im_start|>" not in template:
        deepseek = model_type.startswith("deepseek")
    if deepseek:
        # V3.1's template takes a `thinking` switch and opens or closes the block itself.
        return "deepseek_v31" if _THINKING_SWITCH.search(template) else "deepseek_r1"
    return "qwen3"
