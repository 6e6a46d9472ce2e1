"""Parser choice per model (flags, the guess from config.json and the chat template), the
tool_choice constraints, and the scanning helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from switchyard.preprocessor.chat_template import default_template_source
from switchyard.preprocessor.errors import InvalidRequestError
from switchyard.preprocessor.parsers import Constraint, UnknownParserError, parsers_for
from switchyard.preprocessor.parsers.constrained import NamedToolParser, RequiredToolParser
from switchyard.preprocessor.parsers.constraints import (
    tool_choice_constraint,
)
from switchyard.preprocessor.parsers.deepseek import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from switchyard.preprocessor.parsers.hermes import HermesToolParser
from switchyard.preprocessor.parsers.kimi_k2 import KimiK2ToolParser
from switchyard.preprocessor.parsers.llama3 import Llama3JsonToolParser
from switchyard.preprocessor.parsers.mistral import MistralToolParser
from switchyard.preprocessor.parsers.scan import JsonEnd, match_header, partial_suffix

FIXTURES = Path(__file__).parent / "templates"
DEEPSEEK = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"$ref": "#/$defs/city"}},
            "$defs": {"city": {"type": "string"}},
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


class TestGuess:
    def test_bundled_deepseek_v3(self) -> None:
        choice = parsers_for(DEEPSEEK, default_template_source())
        assert choice.tool is DeepSeekV3ToolParser and choice.reasoning is None
        assert not choice.needs_special_tokens

    def test_deepseek_r1_and_v31_share_the_model_type(self) -> None:
        r1 = parsers_for(DEEPSEEK, fixture("deepseek_r1.jinja"))
        assert r1.tool is DeepSeekV3ToolParser
        assert r1.reasoning is not None and r1.reasoning.name == "deepseek_r1"
        v31 = parsers_for(DEEPSEEK, fixture("deepseek_v31.jinja"))
        assert v31.tool is DeepSeekV31ToolParser
        assert v31.reasoning is not None and v31.reasoning.name == "deepseek_v31"

    def test_qwen(self) -> None:
        qwen25 = parsers_for({"model_type": "qwen2"}, fixture("qwen25.jinja"))
        assert qwen25.tool is HermesToolParser and qwen25.reasoning is None
        qwen3 = parsers_for({"model_type": "qwen3"}, fixture("qwen3.jinja"))
        assert qwen3.tool is HermesToolParser
        assert qwen3.reasoning is not None and qwen3.reasoning.name == "qwen3"

    def test_qwen3_coder_xml_is_not_hermes(self) -> None:
        template = "<tool_call>\n<function={{ name }}>\n<parameter=x>"
        assert parsers_for({"model_type": "qwen3_moe"}, template).tool is None

    def test_template_markup_beats_the_architecture(self) -> None:
        kimi = {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]}
        template = "{{ '<|tool_calls_section_begin|>' }}<|im_middle|>"
        assert parsers_for(kimi, template).tool is KimiK2ToolParser
        assert parsers_for({"architectures": ["DeepseekV3ForCausalLM"]}, template).tool is (
            KimiK2ToolParser
        )

    def test_config_only(self) -> None:
        assert parsers_for({"model_type": "kimi_k2"}, None).tool is KimiK2ToolParser
        assert parsers_for({"model_type": "mistral"}, "").tool is MistralToolParser
        assert parsers_for({"model_type": "llama"}, "").tool is Llama3JsonToolParser
        assert parsers_for({"architectures": ["Qwen2ForCausalLM"]}, "").tool is HermesToolParser
        assert parsers_for({}, "").tool is None and parsers_for(None, None).reasoning is None

    def test_markup_in_templates(self) -> None:
        mistral = parsers_for({}, "{{ '[TOOL_CALLS]' + tool_calls | tojson }}")
        assert mistral.tool is MistralToolParser and mistral.needs_special_tokens
        assert parsers_for({}, "<|python_tag|>{{ x }}").tool is Llama3JsonToolParser


class TestOverrides:
    def test_names_and_aliases(self) -> None:
        assert parsers_for(DEEPSEEK, "", "deepseek_v31").tool is DeepSeekV31ToolParser
        assert parsers_for({}, "", "deepseekv3").tool is DeepSeekV3ToolParser  # SGLang's
        assert parsers_for({}, "", "qwen25").tool is HermesToolParser
        assert parsers_for({}, "", "llama3").tool is Llama3JsonToolParser
        choice = parsers_for({}, "", override_reasoning="deepseek-r1")
        assert choice.reasoning is not None and choice.reasoning.forced

    def test_none_switches_off(self) -> None:
        choice = parsers_for(DEEPSEEK, fixture("deepseek_r1.jinja"), "none", "none")
        assert choice.tool is None and choice.reasoning is None

    def test_unknown_name_fails_loudly(self) -> None:
        with pytest.raises(UnknownParserError, match="unknown tool-call parser 'gpt9'"):
            parsers_for({}, "", "gpt9")
        with pytest.raises(UnknownParserError, match="unknown reasoning parser"):
            parsers_for({}, "", override_reasoning="cot")


class TestForRequest:
    def test_tool_choice_picks_the_parser(self) -> None:
        choice = parsers_for(DEEPSEEK, default_template_source())
        tools = [WEATHER, TIME]
        assert isinstance(choice.for_request(tools=tools).tools, DeepSeekV3ToolParser)
        assert choice.for_request(tools=tools, tool_choice="none").tools is None
        assert choice.for_request(tool_choice="auto").tools is None  # no tools
        required = choice.for_request(tools=tools, tool_choice="required")
        assert isinstance(required.tools, RequiredToolParser)
        named = choice.for_request(
            tools=tools, tool_choice={"type": "function", "function": {"name": "get_time"}}
        )
        assert isinstance(named.tools, NamedToolParser)

    def test_no_parsers_is_a_passthrough(self) -> None:
        parser = parsers_for({}, "").for_request(tools=[WEATHER])
        assert parser.feed("<tool_call>x") == ("<tool_call>x", "", ())
        assert parser.finish() == ("", "", ()) and not parser.called


class TestToolChoiceConstraint:
    def test_none_and_auto(self) -> None:
        for choice in (None, "auto", "none"):
            assert tool_choice_constraint([WEATHER], choice) is None

    def test_required(self) -> None:
        constraint = tool_choice_constraint([WEATHER, TIME], "required")
        assert isinstance(constraint, Constraint) and constraint.kind == "json_schema"
        schema = json.loads(constraint.value)
        assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
        names = [o["properties"]["name"]["enum"] for o in schema["items"]["anyOf"]]
        assert names == [["get_weather"], ["get_time"]]
        assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {
            "type": "object",
            "properties": {},
        }
        assert schema["$defs"] == {"city": {"type": "string"}}
        single = json.loads(tool_choice_constraint([TIME], "required", False).value)  # type: ignore[union-attr]
        assert single["maxItems"] == 1

    def test_named(self) -> None:
        named = {"type": "function", "function": {"name": "get_weather"}}
        constraint = tool_choice_constraint([WEATHER, TIME], named)
        assert constraint is not None
        assert json.loads(constraint.value) == WEATHER["function"]["parameters"]  # type: ignore[index]

    @pytest.mark.parametrize(
        ("tools", "choice", "param"),
        [
            ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
            ([WEATHER], {"type": "function"}, "tool_choice"),
            ([WEATHER], "always", "tool_choice"),
            ([], "required", "tool_choice"),
            ([{"type": "function"}], "required", "tools"),
        ],
    )
    def test_errors_name_the_field(self, tools: list, choice: object, param: str) -> None:
        with pytest.raises(InvalidRequestError) as info:
            tool_choice_constraint(tools, choice)  # type: ignore[arg-type]
        assert info.value.param == param

    def test_conflicting_defs(self) -> None:
        other = json.loads(json.dumps(WEATHER))
        other["function"]["name"] = "other"
        other["function"]["parameters"]["$defs"]["city"] = {"type": "integer"}
        with pytest.raises(InvalidRequestError) as info:
            tool_choice_constraint([WEATHER, other], "required")
        assert info.value.param == "tools"


class TestScan:
    def test_partial_suffix(self) -> None:
        assert partial_suffix("abc<｜tool", "<｜tool▁calls▁begin｜>") == 6
        assert partial_suffix("abc", "<x>") == 0
        assert partial_suffix("<<x", "<x>") == 2
        assert partial_suffix("<x>", "<x>") == 0  # a whole marker is found, not held

    def test_json_end_across_feeds(self) -> None:
        text = '{"a": "}\\"{", "b": [1, {"c": []}]} tail'
        for at in range(len(text)):
            scan = JsonEnd(0)
            first = scan.scan(text[:at])
            end = first if first != -1 else scan.scan(text)
            assert text[:end] == '{"a": "}\\"{", "b": [1, {"c": []}]}'

    def test_header(self) -> None:
        full = '{"name": "get_weather", "arguments": {"city": 1}}'
        for at in range(len(full)):
            result = match_header(full[:at])
            if at < full.index("{", 1):
                assert result is True
        header = match_header(full)
        assert not isinstance(header, bool) and header.name == "get_weather"
        assert full[header.args_start] == "{"
        assert match_header('{"arguments": {}, "name": "x"}') is False
        assert match_header('{"names": 1}') is False
        assert match_header("[1]") is False


def test_a_chatml_template_thinks_like_qwen3_whatever_config_json_says() -> None:
    """Regression test: a Qwen3-format template served with a DeepSeek config.json (as the mock
    engine serves its bundle) was guessed as DeepSeek-R1, which reads every output as
    reasoning."""
    from pathlib import Path

    from switchyard.preprocessor.parsers.registry import guess_reasoning_parser

    template = (Path(__file__).parent / "templates" / "qwen3.jinja").read_text()
    assert guess_reasoning_parser({"model_type": "deepseek_v3"}, template) == "qwen3"
