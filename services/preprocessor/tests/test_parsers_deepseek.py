"""DeepSeek V3 / R1 and V3.1 tool-call markup, streamed at every split point and token by
token through the real DeepSeek tokenizer (its markers are single tokens there)."""

from __future__ import annotations

import pytest
from support.parsers import check_chunkings, collect, counter_ids, shape

from switchyard.preprocessor.parsers.deepseek import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
)
from switchyard.preprocessor.tokenizer import TokenizerBundle

TOOLS = ["get_weather", "get_time"]


def v3_call(name: str, args: str) -> str:
    return f"{CALL_BEGIN}function{SEP}{name}\n```json\n{args}\n```{CALL_END}"


def v31_call(name: str, args: str) -> str:
    return f"{CALL_BEGIN}{name}{SEP}{args}{CALL_END}"


WEATHER = '{"city": "Paris", "days": [1, 2]}'
TIME = '{"tz": "Europe/Paris"}'


def v3(strict: bool, tools: list[str] | None = TOOLS, **kw: object) -> DeepSeekV3ToolParser:
    return DeepSeekV3ToolParser(tools, strict=strict, new_id=counter_ids(), **kw)  # type: ignore[arg-type]


def v31(strict: bool) -> DeepSeekV31ToolParser:
    return DeepSeekV31ToolParser(TOOLS, strict=strict, new_id=counter_ids())


class TestTokenizer:
    def test_markers_are_single_ordinary_tokens(self, bundle: TokenizerBundle) -> None:
        for marker in (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP):
            ids = bundle.encode(marker)
            assert len(ids) == 1
            assert bundle.decode(ids) == marker  # kept when special tokens are skipped


class TestV3:
    def test_content_then_parallel_calls(self, bundle: TokenizerBundle) -> None:
        text = (
            "Let me check both."
            + CALLS_BEGIN
            + v3_call("get_weather", WEATHER)
            + "\n"
            + v3_call("get_time", TIME)
            + CALLS_END
        )
        want = ("Let me check both.", "", (("get_weather", WEATHER), ("get_time", TIME)))
        check_chunkings(v3, text, want, tokenizer=bundle)

    def test_calls_only_and_text_after(self, bundle: TokenizerBundle) -> None:
        text = CALLS_BEGIN + v3_call("get_time", "{}") + CALLS_END + "\n\nDone."
        check_chunkings(v3, text, ("Done.", "", (("get_time", "{}"),)), tokenizer=bundle)

    def test_multiline_arguments(self, bundle: TokenizerBundle) -> None:
        args = '{\n  "city": "Paris",\n  "note": "a ```fence``` inside"\n}'
        text = CALLS_BEGIN + v3_call("get_weather", args) + CALLS_END
        check_chunkings(v3, text, ("", "", (("get_weather", args),)), tokenizer=bundle)

    def test_bare_call_marker_without_section(self, bundle: TokenizerBundle) -> None:
        text = "ok " + v3_call("get_weather", WEATHER)
        check_chunkings(v3, text, ("ok ", "", (("get_weather", WEATHER),)), tokenizer=bundle)

    def test_plain_text_with_angle_brackets(self, bundle: TokenizerBundle) -> None:
        text = "if a < b and b <| c then <｜tool is not a marker <"
        check_chunkings(v3, text, (text, "", ()), tokenizer=bundle)

    def test_missing_section_end_is_tolerated(self, bundle: TokenizerBundle) -> None:
        text = CALLS_BEGIN + v3_call("get_weather", WEATHER)
        check_chunkings(v3, text, ("", "", (("get_weather", WEATHER),)), tokenizer=bundle)

    def test_missing_call_end_with_complete_json(self) -> None:
        text = CALLS_BEGIN + f"{CALL_BEGIN}function{SEP}get_weather\n```json\n{WEATHER}\n```"
        check_chunkings(v3, text, ("", "", (("get_weather", WEATHER),)))

    def test_any_name_when_tools_unknown(self) -> None:
        text = CALLS_BEGIN + v3_call("anything", "{}") + CALLS_END
        parsed = collect(v3(False, tools=None), [text])
        assert shape(parsed) == ("", "", (("anything", "{}"),))

    def test_ids_and_delta_shape(self) -> None:
        parser = v3(False)
        first = parser.feed(CALLS_BEGIN + f"{CALL_BEGIN}function{SEP}get_weather\n```json\n")
        assert [d.to_openai() for d in first[2]] == [
            {
                "index": 0,
                "id": "call_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
        more = parser.feed('{"city": ')  # trailing whitespace waits for what follows
        assert [d.to_openai() for d in more[2]] == [
            {"index": 0, "function": {"arguments": '{"city":'}}
        ]
        assert parser.called

    def test_parallel_tool_calls_false_keeps_the_first(self) -> None:
        text = CALLS_BEGIN + v3_call("get_weather", WEATHER) + v3_call("get_time", TIME) + CALLS_END
        for strict in (False, True):
            parsed = collect(v3(strict, max_calls=1), list(text))
            assert shape(parsed) == ("", "", (("get_weather", WEATHER),))


class TestV3Malformed:
    def test_unknown_tool_falls_back_to_content(self, bundle: TokenizerBundle) -> None:
        text = "Sure." + CALLS_BEGIN + v3_call("delete_everything", "{}") + CALLS_END
        check_chunkings(v3, text, (text, "", ()), tokenizer=bundle)

    def test_unknown_second_call(self) -> None:
        bad = v3_call("nope", "{}")
        text = CALLS_BEGIN + v3_call("get_time", TIME) + "\n" + bad + CALLS_END
        check_chunkings(v3, text, ("\n" + bad + CALLS_END, "", (("get_time", TIME),)))

    def test_bad_json(self, bundle: TokenizerBundle) -> None:
        text = CALLS_BEGIN + v3_call("get_weather", '{"city": "Paris"') + CALLS_END
        # Streaming announced the call before its arguments were known to be broken.
        check_chunkings(
            v3,
            text,
            ("", "", (("get_weather", '{"city": "Paris"'),)),
            strict_expected=(text, "", ()),
            tokenizer=bundle,
        )

    def test_unterminated(self, bundle: TokenizerBundle) -> None:
        text = "Hm." + CALLS_BEGIN + f"{CALL_BEGIN}function{SEP}get_weather\n```json\n" + '{"ci'
        check_chunkings(
            v3,
            text,
            ("Hm.", "", (("get_weather", '{"ci'),)),
            strict_expected=(text, "", ()),
            tokenizer=bundle,
        )

    def test_cut_before_the_name_is_content(self) -> None:
        text = "Hm." + CALLS_BEGIN + f"{CALL_BEGIN}function{SEP}get_wea"
        check_chunkings(v3, text, (text, "", ()))

    def test_garbage_after_section_begin(self) -> None:
        text = "a" + CALLS_BEGIN + "not a call"
        check_chunkings(v3, text, (text, "", ()))

    def test_lone_section_begin_at_the_end(self) -> None:
        text = "a" + CALLS_BEGIN
        check_chunkings(v3, text, (text, "", ()))


class TestV31:
    def test_chained_calls(self, bundle: TokenizerBundle) -> None:
        text = (
            "Checking."
            + CALLS_BEGIN
            + v31_call("get_weather", WEATHER)
            + v31_call("get_time", TIME)
            + CALLS_END
        )
        want = ("Checking.", "", (("get_weather", WEATHER), ("get_time", TIME)))
        check_chunkings(v31, text, want, tokenizer=bundle)

    def test_v3_markup_is_not_v31(self) -> None:
        # V3's "function<sep>name\n```json" header reads as the V3.1 name "function",
        # an unknown tool: the markup stays content rather than a wrong call.
        text = CALLS_BEGIN + v3_call("get_weather", WEATHER) + CALLS_END
        check_chunkings(v31, text, (text, "", ()))

    def test_bad_json_and_unterminated(self) -> None:
        text = CALLS_BEGIN + f"{CALL_BEGIN}get_time{SEP}" + '{"tz": '
        check_chunkings(
            v31, text, ("", "", (("get_time", '{"tz":'),)), strict_expected=(text, "", ())
        )


@pytest.mark.parametrize("parser", [DeepSeekV3ToolParser, DeepSeekV31ToolParser])
def test_no_markup_is_passed_through_untouched(parser: type) -> None:
    p = parser(TOOLS)
    assert p.feed("Plain answer, no tools.") == ("Plain answer, no tools.", "", ())
    assert p.finish() == ("", "", ()) and not p.called
