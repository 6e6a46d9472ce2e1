"""Reasoning parsers in each mode, and composed with the tool parsers: streamed at every
split point and token by token (`<think>` / `</think>` are single DeepSeek tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.parsers import check_chunkings, collect, counter_ids

from switchyard.preprocessor.chat_template import ChatTemplate
from switchyard.preprocessor.parsers.deepseek import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
)
from switchyard.preprocessor.parsers.reasoning import (
    ReasoningFormat,
    ReasoningParser,
    thinking_requested,
)
from switchyard.preprocessor.parsers.registry import REASONING_FORMATS, TOOL_PARSERS, ParserChoice
from switchyard.preprocessor.tokenizer import TokenizerBundle

FIXTURES = Path(__file__).parent / "templates"
QUESTION = [{"role": "user", "content": "2+2?"}]
R1 = REASONING_FORMATS["deepseek_r1"]
QWEN3 = REASONING_FORMATS["qwen3"]
V31 = REASONING_FORMATS["deepseek_v31"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def choice(reasoning: ReasoningFormat, tool: str | None = None) -> ParserChoice:
    return ParserChoice(TOOL_PARSERS[tool] if tool else None, reasoning)


def maker(choice: ParserChoice, prompt: str, **kw: object):  # type: ignore[no-untyped-def]
    def make(strict: bool):  # type: ignore[no-untyped-def]
        return choice.for_request(prompt=prompt, strict=strict, new_id=counter_ids(), **kw)  # type: ignore[arg-type]

    return make


def render(name: str, **kwargs: object) -> str:
    source = (FIXTURES / name).read_text(encoding="utf-8")
    return ChatTemplate(source, "<｜begin▁of▁sentence｜>").render(
        QUESTION, chat_template_kwargs=kwargs
    )


class TestDeepSeekR1:
    def test_template_opens_the_block(self, bundle: TokenizerBundle) -> None:
        prompt = render("deepseek_r1.jinja")
        assert prompt.endswith("<｜Assistant｜><think>\n")
        text = "Two and two.\nThat is 4.\n</think>\n\nThe answer is 4."
        want = ("The answer is 4.", "Two and two.\nThat is 4.", ())
        check_chunkings(maker(choice(R1), prompt), text, want, tokenizer=bundle)

    def test_model_writes_the_tag_itself(self, bundle: TokenizerBundle) -> None:
        text = "<think>\nadd them\n</think>\n\n4"
        check_chunkings(
            maker(choice(R1), "<｜Assistant｜>"), text, ("4", "add them", ()), tokenizer=bundle
        )

    def test_r1_reasons_even_without_the_tag(self) -> None:
        text = "add them</think>4"
        check_chunkings(maker(choice(R1), "<｜Assistant｜>"), text, ("4", "add them", ()))

    def test_cut_off_inside_the_reasoning(self) -> None:
        check_chunkings(
            maker(choice(R1), ""), "still thinking </thi", ("", "still thinking </thi", ())
        )

    def test_thinking_off_is_all_content(self) -> None:
        text = "<think>x</think>y"
        make = maker(choice(R1), "", chat_template_kwargs={"enable_thinking": False})
        check_chunkings(make, text, (text, "", ()))

    def test_then_tool_calls(self, bundle: TokenizerBundle) -> None:
        call = f"{CALL_BEGIN}function{SEP}get_weather\n```json\n{{}}\n```{CALL_END}"
        text = "<think>\nneed weather\n</think>\n\n" + CALLS_BEGIN + call + CALLS_END
        make = maker(choice(R1, "deepseek_r1"), "", tools=TOOLS)
        check_chunkings(
            make, text, ("", "need weather", (("get_weather", "{}"),)), tokenizer=bundle
        )

    def test_tool_call_straight_from_the_thinking(self) -> None:
        call = f"{CALL_BEGIN}get_weather{SEP}{{}}{CALL_END}"
        text = "I should call it." + CALLS_BEGIN + call + CALLS_END
        make = maker(choice(V31, "deepseek_v31"), "<｜Assistant｜><think>", tools=TOOLS)
        check_chunkings(make, text, ("", "I should call it.", (("get_weather", "{}"),)))


class TestQwen3:
    def test_model_opens_the_block(self, bundle: TokenizerBundle) -> None:
        prompt = render("qwen3.jinja")
        text = "<think>\nLet me add.\n</think>\n\nIt is 4."
        check_chunkings(
            maker(choice(QWEN3), prompt), text, ("It is 4.", "Let me add.", ()), tokenizer=bundle
        )

    def test_no_block_is_all_content(self) -> None:
        text = "It is 4. A <think> later is text."
        check_chunkings(maker(choice(QWEN3), render("qwen3.jinja")), text, (text, "", ()))

    def test_enable_thinking_false(self) -> None:
        prompt = render("qwen3.jinja", enable_thinking=False)
        assert prompt.endswith("<think>\n\n</think>\n\n")
        assert QWEN3.parser(prompt) is None  # the template closed the block
        assert QWEN3.parser(render("qwen3.jinja"), {"enable_thinking": False}) is None
        text = "<think>not reasoning</think> 4"
        check_chunkings(maker(choice(QWEN3), prompt), text, (text, "", ()))

    def test_then_hermes_tool_calls(self, bundle: TokenizerBundle) -> None:
        text = (
            "<think>\nweather tool\n</think>\n\n"
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        )
        make = maker(choice(QWEN3, "hermes"), "", tools=TOOLS)
        want = ("", "weather tool", (("get_weather", '{"city": "Paris"}'),))
        check_chunkings(make, text, want, tokenizer=bundle)


class TestDeepSeekV31:
    def test_thinking_off_by_default(self) -> None:
        prompt = render("deepseek_v31.jinja")
        assert prompt.endswith("</think>") and V31.parser(prompt) is None

    def test_thinking_on(self, bundle: TokenizerBundle) -> None:
        prompt = render("deepseek_v31.jinja", thinking=True)
        assert prompt.endswith("<think>")
        text = "Simple sum.</think>4"
        check_chunkings(
            maker(choice(V31), prompt), text, ("4", "Simple sum.", ()), tokenizer=bundle
        )

    def test_a_template_that_neither_opens_nor_closes_the_block(self) -> None:
        """The switch decides, as vLLM's deepseek_v3 parser does (found on a real engine:
        DeepSeek-V3's template under the deepseek_v3 parser name): on, the output starts
        inside the reasoning, markup or not; off or not given, all of it is content."""
        prompt = "<｜User｜>hi<｜Assistant｜>"
        make = maker(choice(V31), prompt, chat_template_kwargs={"thinking": True})
        marked = collect(make(False), "<think>why</think>so")
        assert (marked.content, marked.reasoning) == ("so", "why")
        bare = collect(make(False), "why")
        assert (bare.content, bare.reasoning) == ("", "why")
        assert V31.parser(prompt) is None
        assert V31.parser(prompt, {"thinking": False}) is None


class TestConstrainedAfterReasoning:
    def test_required_calls_follow_the_reasoning(self) -> None:
        text = '<think>pick one</think>[{"name": "get_weather", "parameters": {"city": "P"}}]'
        make = maker(choice(QWEN3, "hermes"), "", tools=TOOLS, tool_choice="required")
        check_chunkings(make, text, ("", "pick one", (("get_weather", '{"city": "P"}'),)))

    def test_named_function_follows_the_reasoning(self) -> None:
        text = '<think>ok</think>{"city": "P"}'
        named = {"type": "function", "function": {"name": "get_weather"}}
        make = maker(choice(QWEN3, "hermes"), "", tools=TOOLS, tool_choice=named)
        check_chunkings(make, text, ("", "ok", (("get_weather", '{"city": "P"}'),)))


class TestParser:
    def test_in_reasoning_tracks_the_block(self) -> None:
        parser = ReasoningParser(opened=True)
        assert parser.in_reasoning
        parser.feed("thinking")
        assert parser.in_reasoning
        parser.feed("</think>")
        assert not parser.in_reasoning

    def test_lead_is_not_reasoning_until_the_tag(self) -> None:
        parser = ReasoningParser()
        assert not parser.in_reasoning
        assert parser.feed("<thi") == ("", "", ())
        parser.feed("nk>")
        assert parser.in_reasoning

    def test_content_after_reasoning_is_passed_through(self) -> None:
        parser = ReasoningParser(opened=True)
        parser.feed("r</think>a")
        assert parser.feed(" b ") == (" b ", "", ())

    @pytest.mark.parametrize(
        ("kwargs", "want"),
        [
            (None, None),
            ({}, None),
            ({"enable_thinking": True}, True),
            ({"thinking": False}, False),
            ({"enable_thinking": True, "thinking": False}, False),
            ({"other": 1}, None),
        ],
    )
    def test_thinking_switch(self, kwargs: dict | None, want: bool | None) -> None:
        assert thinking_requested(kwargs, ("enable_thinking", "thinking")) is want

    def test_feeder_is_the_only_parser_s_feed(self) -> None:
        only_tools = choice(QWEN3, "hermes").for_request(
            tools=TOOLS, chat_template_kwargs={"enable_thinking": False}
        )
        assert only_tools.reasoning is None and only_tools.tools is not None
        assert only_tools.feeder() == only_tools.tools.feed
        only_reasoning = choice(QWEN3).for_request()
        assert only_reasoning.reasoning is not None
        assert only_reasoning.feeder() == only_reasoning.reasoning.feed
        both = choice(QWEN3, "hermes").for_request(tools=TOOLS)
        assert both.feeder() == both.feed

    def test_composed_parser_reports_calls(self) -> None:
        parser = choice(QWEN3, "hermes").for_request(tools=TOOLS)
        out = collect(
            parser, ['<think>x</think><tool_call>{"name": "get_weather", "arguments": {}}']
        )
        assert parser.called and out.reasoning == "x" and len(out.tool_calls) == 1
