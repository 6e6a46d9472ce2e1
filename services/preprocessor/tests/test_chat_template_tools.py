"""Chat templates with tools: a full tool loop (user -> assistant tool_calls -> tool result ->
assistant -> user) rendered by each family's template as the family's own does, plus the
HF semantics around it (tools, tool call arguments, chat_template_kwargs)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from switchyard.preprocessor.chat_template import (
    ChatTemplate,
    JsonArguments,
    default_template_source,
    json_arguments,
)
from switchyard.preprocessor.errors import InvalidRequestError
from switchyard.preprocessor.tokenizer import TokenizerBundle

FIXTURES = Path(__file__).parent / "templates"
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOOLS_JSON = json.dumps(TOOLS[0], ensure_ascii=False)
ARGS = '{"city":"Paris"}'  # as OpenAI clients send it: JSON text


def call(call_id: str, arguments: str) -> dict[str, Any]:
    function = {"name": "get_weather", "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function}


def tool_loop() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("call_1", ARGS), call("call_2", '{"city":"Lyon"}')],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
        {"role": "assistant", "content": "Paris sunny, Lyon rain."},
        {"role": "user", "content": "Thanks"},
    ]


def fixture(name: str, bos: str = "") -> ChatTemplate:
    return ChatTemplate((FIXTURES / name).read_text(encoding="utf-8"), bos, EOS)


def v3_call(name: str, args: str) -> str:
    header = f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}"
    return f"{header}\n```json\n{args}\n```<｜tool▁call▁end｜>"


class TestDeepSeekV3:
    """The bundled template (the mock engine serves the same file)."""

    def template(self) -> ChatTemplate:
        return ChatTemplate(default_template_source(), BOS, EOS)

    def test_tool_loop(self) -> None:
        text = self.template().render(tool_loop())
        assert text == (
            f"{BOS}Be brief.<｜User｜>Weather in Paris?<｜Assistant｜>"
            "<｜tool▁calls▁begin｜>"
            + v3_call("get_weather", ARGS)
            + "\n"
            + v3_call("get_weather", '{"city":"Lyon"}')
            + f"<｜tool▁calls▁end｜>{EOS}"
            "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>"
            "\n<｜tool▁output▁begin｜>rain<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
            f"Paris sunny, Lyon rain.{EOS}<｜User｜>Thanks<｜Assistant｜>"
        )

    def test_generation_after_tool_results_follows_them_directly(self) -> None:
        text = self.template().render(tool_loop()[:5])
        assert text.endswith("rain<｜tool▁output▁end｜><｜tool▁outputs▁end｜>")

    def test_content_before_the_calls(self) -> None:
        messages = tool_loop()[:3]
        messages[2] = dict(messages[2], content="Checking.")
        assert "<｜Assistant｜>Checking.<｜tool▁calls▁begin｜>" in self.template().render(messages)

    def test_tools_described_only_when_given(self) -> None:
        question = [{"role": "user", "content": "hi"}]
        assert self.template().render(question) == f"{BOS}<｜User｜>hi<｜Assistant｜>"
        with_tools = self.template().render(question, tools=TOOLS)
        assert f"<tools>\n{TOOLS_JSON}\n</tools>" in with_tools
        assert with_tools.endswith("<｜User｜>hi<｜Assistant｜>")

    def test_markers_tokenize_as_single_tokens(self, bundle: TokenizerBundle) -> None:
        ids = bundle.encode(self.template().render(tool_loop()))
        for marker in ("<｜tool▁calls▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"):
            assert bundle.token_to_id(marker) in ids


class TestDeepSeekR1:
    def test_tool_loop_and_open_think_block(self) -> None:
        text = fixture("deepseek_r1.jinja", BOS).render(tool_loop())
        assert text == (
            f"{BOS}Be brief.<｜User｜>Weather in Paris?"
            "<｜Assistant｜><｜tool▁calls▁begin｜>"
            + v3_call("get_weather", ARGS)
            + "\n"
            + v3_call("get_weather", '{"city":"Lyon"}')
            + f"<｜tool▁calls▁end｜>{EOS}"
            "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>"
            "<｜tool▁output▁begin｜>rain<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
            f"Paris sunny, Lyon rain.{EOS}<｜User｜>Thanks<｜Assistant｜><think>\n"
        )

    def test_earlier_reasoning_is_cut(self) -> None:
        messages = [
            {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "<think>\nadd\n</think>\n\n2"},
            {"role": "user", "content": "2+2?"},
        ]
        text = fixture("deepseek_r1.jinja", BOS).render(messages)
        assert "<｜Assistant｜>\n\n2<｜end▁of▁sentence｜>" in text and "add" not in text


class TestDeepSeekV31:
    def test_tool_loop(self) -> None:
        text = fixture("deepseek_v31.jinja", BOS).render(tool_loop(), tools=TOOLS)
        assert "### get_weather\nDescription: Weather now\n\nParameters: " in text
        assert text.endswith(
            "<｜User｜>Weather in Paris?<｜Assistant｜></think><｜tool▁calls▁begin｜>"
            f"<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>"
            '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city":"Lyon"}<｜tool▁call▁end｜>'
            f"<｜tool▁calls▁end｜>{EOS}"
            "<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>"
            "<｜tool▁output▁begin｜>rain<｜tool▁output▁end｜>"
            f"Paris sunny, Lyon rain.{EOS}<｜User｜>Thanks<｜Assistant｜></think>"
        )

    def test_thinking_switch(self) -> None:
        template = fixture("deepseek_v31.jinja", BOS)
        question = [{"role": "user", "content": "hi"}]
        assert template.render(question).endswith("<｜Assistant｜></think>")
        assert template.render(question, thinking=True).endswith("<｜Assistant｜><think>")


QWEN_TOOLS_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    f"{TOOLS_JSON}\n</tools>\n\nFor each function call, return a json object with function "
    "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
QWEN_LOOP = (
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
    "<|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
    "<tool_response>\nrain\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nParis sunny, Lyon rain.<|im_end|>\n"
    "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n"
)


class TestQwen25:
    def test_tool_loop(self) -> None:
        text = fixture("qwen25.jinja").render(tool_loop(), tools=TOOLS)
        # `arguments | tojson` needs a mapping: the JSON text the client sent is one.
        assert text == "<|im_start|>system\nBe brief.\n\n" + QWEN_TOOLS_SYSTEM + QWEN_LOOP


class TestQwen3:
    def test_tool_loop(self) -> None:
        text = fixture("qwen3.jinja").render(tool_loop(), tools=TOOLS)
        assert text == "<|im_start|>system\nBe brief.\n\n" + QWEN_TOOLS_SYSTEM + QWEN_LOOP

    def test_enable_thinking_false_closes_the_block(self) -> None:
        question = [{"role": "user", "content": "hi"}]
        assert (
            fixture("qwen3.jinja")
            .render(question, enable_thinking=False)
            .endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        )
        assert fixture("qwen3.jinja").render(question).endswith("<|im_start|>assistant\n")

    def test_reasoning_content_of_the_current_turn(self) -> None:
        messages = [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Need the tool.",
                "tool_calls": tool_loop()[2]["tool_calls"][:1],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        text = fixture("qwen3.jinja").render(messages, tools=TOOLS)
        assert "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n<tool_call>" in text


class TestArguments:
    def test_mapping_that_renders_as_the_client_text(self) -> None:
        args = json_arguments('{"city":"Paris"}')
        assert isinstance(args, JsonArguments) and args == {"city": "Paris"}
        assert str(args) == '{"city":"Paris"}'
        assert "x" + args == 'x{"city":"Paris"}' and args + "y" == '{"city":"Paris"}y'
        assert json.dumps(args) == '{"city": "Paris"}'

    def test_other_values(self) -> None:
        assert json_arguments("not json") == "not json"
        assert json_arguments("[1, 2]") == "[1, 2]"
        assert json_arguments("") == {} and str(json_arguments(None)) == "{}"
        mapping = json_arguments({"a": 1})
        assert mapping == {"a": 1} and str(mapping) == '{"a": 1}'

    def test_messages_are_not_modified(self) -> None:
        messages = tool_loop()
        before = json.dumps(messages)
        fixture("qwen25.jinja").render(messages, tools=TOOLS)
        assert json.dumps(messages) == before

    def test_absent_keys_stay_absent(self) -> None:
        source = "{% for m in messages %}{{ 'tool_calls' in m }},{{ 'name' in m }};{% endfor %}"
        messages = [
            {"role": "assistant", "content": "x", "tool_calls": None, "name": None},
            {"role": "assistant", "content": "x", "tool_calls": []},
        ]
        assert ChatTemplate(source).render(messages) == "False,False;False,False;"


class TestKwargs:
    def test_extra_variables_reach_the_template(self) -> None:
        template = ChatTemplate("{{ custom }}|{{ tools | length if tools else 'none' }}")
        assert template.render([], chat_template_kwargs={"custom": "yes"}) == "yes|none"
        assert template.render([], tools=TOOLS, custom="y") == "y|1"

    @pytest.mark.parametrize("key", ["messages", "tools", "add_generation_prompt"])
    def test_reserved_names_are_a_400(self, key: str) -> None:
        with pytest.raises(InvalidRequestError) as info:
            ChatTemplate("x").render([], chat_template_kwargs={key: 1})
        assert info.value.param == "chat_template_kwargs"

    def test_type_errors_in_a_template_are_a_400(self) -> None:
        with pytest.raises(InvalidRequestError) as info:
            ChatTemplate("{{ 'a' + messages[0]['n'] }}").render([{"role": "user", "n": 3}])
        assert info.value.param == "messages"

    def test_generation_tag(self) -> None:
        source = (
            "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}"
            "{% endfor %}"
        )
        assert ChatTemplate(source).render([{"role": "assistant", "content": "a"}]) == "<a>"


def one_call_loop(call_id: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call(call_id, ARGS)]},
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Thanks"},
    ]


class TestLlama31:
    def template(self) -> ChatTemplate:
        return ChatTemplate(
            (FIXTURES / "llama31_json.jinja").read_text(encoding="utf-8"),
            "<|begin_of_text|>",
            now=lambda: datetime(2025, 3, 7),
        )

    def test_tool_loop(self) -> None:
        text = self.template().render(one_call_loop("call_1"), tools=TOOLS)
        assert "Today Date: 07 Mar 2025\n\n<|eot_id|>" in text
        assert json.dumps(TOOLS[0], indent=4) + "\n\nWeather in Paris?<|eot_id|>" in text
        assert text.endswith(
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
            '<|start_header_id|>ipython<|end_header_id|>\n\n{"output": "sunny"}<|eot_id|>'
            "<|start_header_id|>assistant<|end_header_id|>\n\nSunny.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        )

    def test_parallel_calls_are_refused_by_the_template(self) -> None:
        messages = tool_loop()[1:3]
        with pytest.raises(InvalidRequestError, match="single tool-calls"):
            self.template().render(messages, tools=TOOLS)


class TestMistral:
    def template(self) -> ChatTemplate:
        return ChatTemplate(
            (FIXTURES / "mistral_v03.jinja").read_text(encoding="utf-8"), "<s>", "</s>"
        )

    def test_tool_loop(self) -> None:
        text = self.template().render(one_call_loop("a1b2c3d4e"), tools=TOOLS)
        assert text == (
            "<s>[INST] Weather in Paris?[/INST]"
            '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, '
            '"id": "a1b2c3d4e"}]</s>'
            '[TOOL_RESULTS] {"content": sunny, "call_id": "a1b2c3d4e"}[/TOOL_RESULTS] Sunny.</s>'
            f"[AVAILABLE_TOOLS] [{TOOLS_JSON}][/AVAILABLE_TOOLS][INST] Thanks[/INST]"
        )

    def test_ids_must_be_nine_characters(self) -> None:
        with pytest.raises(InvalidRequestError, match="length 9"):
            self.template().render(one_call_loop("call_abcdef123"), tools=TOOLS)


class TestKimiK2:
    def test_tool_loop_keeps_the_markup_ids(self) -> None:
        template = ChatTemplate((FIXTURES / "kimi_k2.jinja").read_text(encoding="utf-8"))
        text = template.render(one_call_loop("functions.get_weather:0"), tools=TOOLS)
        assert text.startswith(f"<|im_system|>tool_declare<|im_middle|>[{TOOLS_JSON}]<|im_end|>")
        assert (
            "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|>"
            "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
            f"{ARGS}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
            "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\nsunny<|im_end|>"
        ) in text


class TestRoundTrip:
    """What a parser reads from the model becomes the next turn's history: rendered by the
    family's template, it is the markup the model wrote (same ids where the format has
    them, arguments as the model wrote them)."""

    def assistant_turn(self, parser: Any, markup: str) -> dict[str, Any]:
        parsed = parser.parse_complete(markup, ["get_weather"])
        assert parsed.tool_calls and not parsed.content
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [c.to_openai() for c in parsed.tool_calls],
        }

    def test_deepseek_v3(self) -> None:
        from switchyard.preprocessor.parsers.deepseek import DeepSeekV3ToolParser

        markup = (
            "<｜tool▁calls▁begin｜>"
            + v3_call("get_weather", ARGS)
            + "\n"
            + v3_call("get_weather", '{"city": "Lyon"}')
            + "<｜tool▁calls▁end｜>"
        )
        turn = self.assistant_turn(DeepSeekV3ToolParser, markup)
        text = ChatTemplate(default_template_source(), BOS, EOS).render(
            [{"role": "user", "content": "q"}, turn], add_generation_prompt=False
        )
        assert text == f"{BOS}<｜User｜>q<｜Assistant｜>{markup}{EOS}"

    def test_kimi_k2(self) -> None:
        from switchyard.preprocessor.parsers.kimi_k2 import KimiK2ToolParser

        markup = (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            f"<|tool_call_argument_begin|>{ARGS}<|tool_call_end|><|tool_calls_section_end|>"
        )
        turn = self.assistant_turn(KimiK2ToolParser, markup)
        text = ChatTemplate((FIXTURES / "kimi_k2.jinja").read_text(encoding="utf-8")).render(
            [{"role": "user", "content": "q"}, turn], add_generation_prompt=False
        )
        assert f"<|im_assistant|>assistant<|im_middle|>{markup}<|im_end|>" in text

    def test_mistral_ids_satisfy_the_template(self) -> None:
        from switchyard.preprocessor.parsers.mistral import MistralToolParser

        turn = self.assistant_turn(MistralToolParser, f"[TOOL_CALLS]get_weather[ARGS]{ARGS}")
        call_id = turn["tool_calls"][0]["id"]
        messages = [
            {"role": "user", "content": "q"},
            turn,
            {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
        ]
        text = ChatTemplate(
            (FIXTURES / "mistral_v03.jinja").read_text(encoding="utf-8"), "<s>", "</s>"
        ).render(messages)
        assert f'"id": "{call_id}"}}]</s>[TOOL_RESULTS]' in text

    def test_hermes(self) -> None:
        from switchyard.preprocessor.parsers.hermes import HermesToolParser

        markup = (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        )
        turn = self.assistant_turn(HermesToolParser, markup)
        text = fixture("qwen25.jinja").render(
            [{"role": "user", "content": "q"}, turn], add_generation_prompt=False
        )
        assert f"<|im_start|>assistant\n{markup}<|im_end|>" in text
