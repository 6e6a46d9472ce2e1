"""Kimi-K2 markup, and the output of tool_choice constraints (required / a named function)."""

from __future__ import annotations

from switchyard.preprocessor.parsers.constrained import NamedToolParser, RequiredToolParser
from switchyard.preprocessor.parsers.kimi_k2 import KimiK2ToolParser
from switchyard.preprocessor.parsers.testing import check_chunkings, collect, counter_ids
from switchyard.preprocessor.tokenizer import TokenizerBundle

TOOLS = ["get_weather", "get_time"]
WEATHER = '{"city": "Paris"}'

SECTION = "<|tool_calls_section_begin|>"
END = "<|tool_calls_section_end|>"


def kimi_call(call_id: str, args: str) -> str:
    return f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


def kimi(strict: bool) -> KimiK2ToolParser:
    return KimiK2ToolParser(TOOLS, strict=strict, new_id=counter_ids())


class TestKimiK2:
    def test_calls_keep_the_markup_ids(self, bundle: TokenizerBundle) -> None:
        text = (
            "Let me see."
            + SECTION
            + kimi_call("functions.get_weather:0", WEATHER)
            + kimi_call("functions.get_time:1", "{}")
            + END
        )
        want = ("Let me see.", "", (("get_weather", WEATHER), ("get_time", "{}")))
        check_chunkings(kimi, text, want, tokenizer=bundle)
        parsed = collect(kimi(False), [text])
        assert [c.id for c in parsed.tool_calls] == [
            "functions.get_weather:0",
            "functions.get_time:1",
        ]

    def test_bad_call_id_and_unknown_tool(self) -> None:
        for call_id in ("get weather", "functions.launch:0"):
            text = SECTION + kimi_call(call_id, "{}") + END
            check_chunkings(kimi, text, (text, "", ()))

    def test_unterminated(self) -> None:
        text = SECTION + '<|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{"a'
        check_chunkings(
            kimi, text, ("", "", (("get_time", '{"a'),)), strict_expected=(text, "", ())
        )


def required(strict: bool, max_calls: int | None = None) -> RequiredToolParser:
    return RequiredToolParser(TOOLS, strict=strict, new_id=counter_ids(), max_calls=max_calls)


def named(strict: bool) -> NamedToolParser:
    return NamedToolParser("get_weather", strict=strict, new_id=counter_ids())


class TestRequired:
    def test_list_of_calls(self, bundle: TokenizerBundle) -> None:
        text = (
            '[{"name": "get_weather", "parameters": '
            + WEATHER
            + '}, {"name": "get_time", "parameters": {}}]'
        )
        want = ("", "", (("get_weather", WEATHER), ("get_time", "{}")))
        check_chunkings(required, text, want, tokenizer=bundle)

    def test_compact_json_as_constrained_engines_write_it(self) -> None:
        text = '[{"name":"get_time","parameters":{"tz":"UTC"}}]'
        check_chunkings(required, text, ("", "", (("get_time", '{"tz":"UTC"}'),)))

    def test_one_call_when_not_parallel(self) -> None:
        text = '[{"name": "get_time", "parameters": {}}, {"name": "get_time", "parameters": {}}]'
        for strict in (False, True):
            parsed = collect(required(strict, max_calls=1), list(text))
            assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_time", "{}")]
            assert parsed.content == ""

    def test_output_that_ignored_the_constraint_is_content(self) -> None:
        check_chunkings(required, "I cannot do that.", ("I cannot do that.", "", ()))


class TestNamed:
    def test_whole_output_is_the_arguments(self, bundle: TokenizerBundle) -> None:
        text = ' {"city": "Paris", "days": 3}\n'
        want = ("", "", (("get_weather", '{"city": "Paris", "days": 3}'),))
        check_chunkings(named, text, want, tokenizer=bundle)

    def test_invalid_json_strict_is_content(self) -> None:
        check_chunkings(
            named,
            '{"city": ',
            ("", "", (("get_weather", '{"city":'),)),
            strict_expected=('{"city": ', "", ()),
        )

    def test_empty_output_is_no_call(self) -> None:
        parser = named(False)
        assert parser.finish() == ("", "", ()) and not parser.called
