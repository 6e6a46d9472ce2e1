"""Kimi-K2 markup, and the output of tool_choice constraints (required / a named function)."""

from __future__ import annotations

from support.parsers import check_chunkings, collect, counter_ids

from switchyard.preprocessor.parsers.constrained import NamedToolParser, RequiredToolParser
from switchyard.preprocessor.parsers.kimi_k2 import KimiK2ToolParser
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


LIST = (
    '[{"name": "get_weather", "parameters": '
    + WEATHER
    + '}, {"name": "get_time", "parameters": {"tz": "UTC"}}]'
)


class TestRequiredCutOff:
    """Regression: a required list cut off by max_tokens spilled its JSON into content
    ('[{"name": "get_weather", "' or ', {"name": ...' after a complete call), streamed and
    not. Now, as vLLM streams it: complete calls, then the last call once its name and the
    start of its arguments were read, with the arguments it has; the list syntax is never
    content, and the streamed and whole results agree."""

    def test_cut_before_the_arguments_drops_the_item(self) -> None:
        for text in (
            "[",
            "[ ",
            '[{"name": "get_weather", "',
            '[{"name": "get_weather", "parameters": ',
        ):
            check_chunkings(required, text, ("", "", ()))

    def test_cut_inside_the_arguments_keeps_them(self) -> None:
        text = '[{"name": "get_weather", "parameters": {"city": "Pa'
        check_chunkings(required, text, ("", "", (("get_weather", '{"city": "Pa'),)))

    def test_cut_after_a_complete_call(self) -> None:
        first = '[{"name": "get_weather", "parameters": ' + WEATHER + "}"
        for tail in ("", ",", ", ", ', {"name": "get_time", "parameters'):
            check_chunkings(required, first + tail, ("", "", (("get_weather", WEATHER),)))
        check_chunkings(
            required,
            first + ', {"name": "get_time", "parameters": {"tz"',
            ("", "", (("get_weather", WEATHER), ("get_time", '{"tz"'))),
        )

    def test_every_cut_is_calls_only(self) -> None:
        """At every length: no content, at most two calls, each call's arguments a prefix
        of the whole one's, streamed (every split) the same as whole."""
        full = (("get_weather", WEATHER), ("get_time", '{"tz": "UTC"}'))
        for end in range(len(LIST) + 1):
            text = LIST[:end]
            got = collect(required(True), [text])
            want = ("", "", tuple((c.name, c.arguments) for c in got.tool_calls))
            assert want[0] == got.content == ""
            for (name, args), (full_name, full_args) in zip(want[2], full, strict=False):
                assert name == full_name and full_args.startswith(args), text
            check_chunkings(required, text, want)

    def test_unknown_name_cut_off_is_content(self) -> None:
        text = '[{"name": "launch", "parameters": {"a'
        check_chunkings(required, text, (text, "", ()))

    def test_one_call_when_not_parallel(self) -> None:
        text = '[{"name": "get_time", "parameters": {}}, {"name": "get_time", "parameters": {"a'
        for strict in (False, True):
            parsed = collect(required(strict, max_calls=1), list(text))
            assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_time", "{}")]
            assert parsed.content == ""


class TestNamed:
    def test_whole_output_is_the_arguments(self, bundle: TokenizerBundle) -> None:
        text = ' {"city": "Paris", "days": 3}\n'
        want = ("", "", (("get_weather", '{"city": "Paris", "days": 3}'),))
        check_chunkings(named, text, want, tokenizer=bundle)

    def test_cut_off_output_is_the_arguments(self) -> None:
        """Regression: a named call cut off by max_tokens was content when not streamed
        ('{"city": "stone echo'). As vLLM: the output is the arguments, complete or not."""
        check_chunkings(named, '{"city": ', ("", "", (("get_weather", '{"city":'),)))
        text = ' {"city": "Paris", "days": 3}\n'
        for end in range(2, len(text) + 1):
            args = text[:end].strip(" \n")
            check_chunkings(named, text[:end], ("", "", (("get_weather", args),)))

    def test_empty_output_is_no_call(self) -> None:
        parser = named(False)
        assert parser.finish() == ("", "", ()) and not parser.called
