"""Tool calls written as JSON objects: Hermes / Qwen 2.5-3, Llama 3 JSON, Mistral (both
forms), at every split point and token by token through the DeepSeek tokenizer (which
splits these families' markers into several tokens, the harder case)."""

from __future__ import annotations

from support.parsers import check_chunkings, collect, counter_ids, shape

from switchyard.preprocessor.parsers.hermes import HermesToolParser
from switchyard.preprocessor.parsers.llama3 import PYTHON_TAG, Llama3JsonToolParser
from switchyard.preprocessor.parsers.mistral import MistralToolParser, mistral_call_id
from switchyard.preprocessor.tokenizer import TokenizerBundle

TOOLS = ["get_weather", "get_time"]
WEATHER = '{"city": "Paris", "when": {"day": "mon", "hours": [9, 17]}, "q": "a \\"}\\" b"}'
TIME = '{"tz": "UTC"}'


def hermes(strict: bool) -> HermesToolParser:
    return HermesToolParser(TOOLS, strict=strict, new_id=counter_ids())


def llama(strict: bool) -> Llama3JsonToolParser:
    return Llama3JsonToolParser(TOOLS, strict=strict, new_id=counter_ids())


def mistral(strict: bool) -> MistralToolParser:
    return MistralToolParser(TOOLS, strict=strict, new_id=counter_ids())


def block(name: str, args: str, key: str = "arguments") -> str:
    return f'<tool_call>\n{{"name": "{name}", "{key}": {args}}}\n</tool_call>'


class TestHermes:
    def test_qwen_parallel_calls_with_content(self, bundle: TokenizerBundle) -> None:
        text = (
            "I'll look both up.\n" + block("get_weather", WEATHER) + "\n" + block("get_time", TIME)
        )
        want = ("I'll look both up.\n", "", (("get_weather", WEATHER), ("get_time", TIME)))
        check_chunkings(hermes, text, want, tokenizer=bundle)

    def test_text_after_the_calls(self, bundle: TokenizerBundle) -> None:
        text = block("get_time", TIME) + "\n\nThat is all."
        check_chunkings(hermes, text, ("That is all.", "", (("get_time", TIME),)), tokenizer=bundle)

    def test_other_key_order_and_string_arguments(self) -> None:
        reordered = '<tool_call>{"arguments": {"tz": "UTC"}, "name": "get_time"}</tool_call>'
        check_chunkings(hermes, reordered, ("", "", (("get_time", '{"tz": "UTC"}'),)))
        stringly = '<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": 1}"}</tool_call>'
        check_chunkings(hermes, stringly, ("", "", (("get_time", '{"tz": 1}'),)))

    def test_missing_close_tag_after_complete_json(self) -> None:
        text = '<tool_call>\n{"name": "get_time", "arguments": {}}'
        check_chunkings(hermes, text, ("", "", (("get_time", "{}"),)))

    def test_unknown_tool(self, bundle: TokenizerBundle) -> None:
        text = "x " + block("rm_rf", "{}")
        check_chunkings(hermes, text, (text, "", ()), tokenizer=bundle)

    def test_bad_json(self) -> None:
        text = '<tool_call>\n{"name": "get_time", "arguments": {"tz": UTC}}\n</tool_call>'
        check_chunkings(
            hermes,
            text,
            ("", "", (("get_time", '{"tz": UTC}'),)),
            strict_expected=(text, "", ()),
        )

    def test_not_json_at_all(self) -> None:
        text = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"
        check_chunkings(hermes, text, (text, "", ()))

    def test_unterminated(self) -> None:
        text = 'ok <tool_call>\n{"name": "get_time", "arguments": {"tz": "U'
        check_chunkings(
            hermes,
            text,
            ("ok ", "", (("get_time", '{"tz": "U'),)),
            strict_expected=(text, "", ()),
        )

    def test_name_arrives_whole(self) -> None:
        parser = hermes(False)
        assert not parser.feed('<tool_call>{"name": "get_ti')[2]
        assert not parser.feed('me", "arguments": ')[2]
        announced = parser.feed("{")[2]
        assert [(d.name, d.arguments) for d in announced] == [("get_time", ""), (None, "{")]


class TestLlama3:
    def test_python_tag_and_semicolons(self, bundle: TokenizerBundle) -> None:
        text = (
            PYTHON_TAG
            + '{"name": "get_weather", "parameters": '
            + WEATHER
            + '}; {"name": "get_time", "parameters": '
            + TIME
            + "}"
        )
        want = ("", "", (("get_weather", WEATHER), ("get_time", TIME)))
        check_chunkings(llama, text, want, tokenizer=bundle)

    def test_bare_json_reply(self, bundle: TokenizerBundle) -> None:
        text = '\n{"name": "get_time", "parameters": {"tz": "UTC"}}'
        check_chunkings(llama, text, ("", "", (("get_time", TIME),)), tokenizer=bundle)

    def test_json_answer_that_is_not_a_call(self, bundle: TokenizerBundle) -> None:
        text = '{"answer": 42, "name": "not first"}'
        check_chunkings(llama, text, (text, "", ()), tokenizer=bundle)

    def test_braces_later_in_a_reply_are_text(self) -> None:
        text = 'Use {"name": "get_time", "parameters": {}} like this.'
        check_chunkings(llama, text, (text, "", ()))

    def test_unknown_tool(self) -> None:
        text = '{"name": "launch", "parameters": {}}'
        check_chunkings(llama, text, (text, "", ()))

    def test_text_after_calls(self) -> None:
        text = '{"name": "get_time", "parameters": {}} and then some words'
        check_chunkings(llama, text, ("and then some words", "", (("get_time", "{}"),)))


class TestMistral:
    def test_json_list_form(self, bundle: TokenizerBundle) -> None:
        text = (
            '[TOOL_CALLS] [{"name": "get_weather", "arguments": '
            + WEATHER
            + '}, {"name": "get_time", "arguments": '
            + TIME
            + "}]"
        )
        want = ("", "", (("get_weather", WEATHER), ("get_time", TIME)))
        check_chunkings(mistral, text, want, tokenizer=bundle)

    def test_compact_form(self, bundle: TokenizerBundle) -> None:
        text = "Sure.[TOOL_CALLS]get_weather[ARGS]" + WEATHER + "[TOOL_CALLS]get_time[ARGS]" + TIME
        want = ("Sure.", "", (("get_weather", WEATHER), ("get_time", TIME)))
        check_chunkings(mistral, text, want, tokenizer=bundle)

    def test_compact_form_with_call_id(self) -> None:
        text = "[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]" + TIME
        check_chunkings(mistral, text, ("", "", (("get_time", TIME),)))

    def test_unknown_tool_and_bad_json(self) -> None:
        unknown = "[TOOL_CALLS]fly[ARGS]{}"
        check_chunkings(mistral, unknown, (unknown, "", ()))
        broken = '[TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": }}]'
        check_chunkings(
            mistral,
            broken,
            ("", "", (("get_time", '{"tz": }'),)),
            strict_expected=(broken, "", ()),
        )

    def test_unterminated_compact(self) -> None:
        text = '[TOOL_CALLS]get_time[ARGS]{"tz": "U'
        check_chunkings(
            mistral, text, ("", "", (("get_time", '{"tz": "U'),)), strict_expected=(text, "", ())
        )

    def test_ids_are_nine_alphanumerics(self) -> None:
        ident = mistral_call_id()
        assert len(ident) == 9 and ident.isalnum()
        parsed = collect(MistralToolParser(TOOLS), ["[TOOL_CALLS]get_time[ARGS]{}"])
        assert shape(parsed)[2] == (("get_time", "{}"),)
        assert len(parsed.tool_calls[0].id) == 9
