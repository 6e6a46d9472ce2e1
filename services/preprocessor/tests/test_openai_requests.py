from __future__ import annotations

from typing import Any

import orjson
import pytest

from switchyard.preprocessor.errors import InvalidRequestError
from switchyard.preprocessor.openai_requests import (
    MAX_FREE_JSON_DEPTH,
    SamplingOptions,
    check_context,
    check_max_tokens,
    free_json_text,
    parse_chat_completion,
    parse_completion,
)

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": USER}
    body.update(fields)
    return orjson.dumps({k: v for k, v in body.items() if v is not _DROP})


def completion(**fields: Any) -> bytes:
    body: dict[str, Any] = {"model": "m", "prompt": "hello"}
    body.update(fields)
    return orjson.dumps({k: v for k, v in body.items() if v is not _DROP})


_DROP = object()


def chat_error(body: bytes) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        parse_chat_completion(body)
    assert info.value.status == 400
    return info.value


def completion_error(body: bytes) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        parse_completion(body)
    assert info.value.status == 400
    return info.value


class TestChatHappyPath:
    def test_minimal_gets_defaults(self) -> None:
        req = parse_chat_completion(chat())
        assert req.model == "m"
        assert req.messages == ({"role": "user", "content": "hi"},)
        assert req.sampling == SamplingOptions()
        assert req.stream is False and req.include_usage is False

    def test_all_fields(self) -> None:
        req = parse_chat_completion(
            chat(
                max_tokens=10,
                temperature=0,
                top_p=0.5,
                top_k=40,
                min_tokens=2,
                seed=-7,
                stop=["a", "b"],
                n=1,
                presence_penalty=-2,
                frequency_penalty=1.5,
                repetition_penalty=1.1,
                ignore_eos=True,
                stream=True,
                stream_options={"include_usage": True},
                logprobs=False,
                user="someone",
            )
        )
        s = req.sampling
        assert (s.max_tokens, s.temperature, s.top_p, s.top_k) == (10, 0.0, 0.5, 40)
        assert (s.min_tokens, s.seed, s.stop) == (2, -7, ("a", "b"))
        assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (-2, 1.5, 1.1)
        assert s.ignore_eos is True
        assert isinstance(s.temperature, float)
        assert req.stream is True and req.include_usage is True
        assert req.user == "someone"

    def test_max_completion_tokens_wins(self) -> None:
        req = parse_chat_completion(chat(max_tokens=5, max_completion_tokens=9))
        assert req.sampling.max_tokens == 9
        assert parse_chat_completion(chat(max_completion_tokens=3)).sampling.max_tokens == 3

    def test_nulls_mean_defaults(self) -> None:
        req = parse_chat_completion(
            chat(max_tokens=None, temperature=None, top_k=None, stop=None, n=None, seed=None)
        )
        assert req.sampling == SamplingOptions()

    def test_stop_string_and_empty_stops(self) -> None:
        assert parse_chat_completion(chat(stop="###")).sampling.stop == ("###",)
        assert parse_chat_completion(chat(stop="")).sampling.stop == ()
        assert parse_chat_completion(chat(stop=["", "x", "x"])).sampling.stop == ("x",)

    def test_include_usage_when_streaming(self) -> None:
        req = parse_chat_completion(chat(stream=True, stream_options={"include_usage": True}))
        assert req.include_usage is True
        req = parse_chat_completion(chat(stream=True, stream_options={"include_usage": False}))
        assert req.include_usage is False

    def test_top_k_minus_one(self) -> None:
        assert parse_chat_completion(chat(top_k=-1)).sampling.top_k == -1

    def test_roles_and_content_parts(self) -> None:
        messages = [
            {"role": "system", "content": "s"},
            {"role": "developer", "content": "d"},
            {"role": "user", "content": [{"type": "text", "text": t} for t in "ab"]},
            {"role": "assistant", "content": None},
            {"role": "tool", "content": "r", "tool_call_id": "call_1"},
            {"role": "user", "content": "u", "name": "bob"},
        ]
        req = parse_chat_completion(chat(messages=messages))
        assert req.messages == (
            {"role": "system", "content": "s"},
            {"role": "developer", "content": "d"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant"},
            {"role": "tool", "content": "r", "tool_call_id": "call_1"},
            {"role": "user", "content": "u", "name": "bob"},
        )

    def test_frozen(self) -> None:
        req = parse_chat_completion(chat())
        with pytest.raises(AttributeError):
            req.model = "x"  # type: ignore[misc]


def nested(depth: int) -> Any:
    """A JSON value `depth` containers deep (objects and arrays alternating)."""
    value: Any = 1
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


class TestNesting:
    def test_free_json_text_keeps_the_text(self) -> None:
        value = {"a": [1, "é", None, {"b": 2.5}]}
        assert orjson.loads(free_json_text(value, "x")) == value
        assert orjson.loads(free_json_text(nested(MAX_FREE_JSON_DEPTH), "x")) == nested(
            MAX_FREE_JSON_DEPTH
        )

    def test_free_json_text_refuses_deeper_values_and_huge_integers(self) -> None:
        with pytest.raises(InvalidRequestError) as info:
            free_json_text(nested(MAX_FREE_JSON_DEPTH + 1), "guided_json")
        assert (info.value.status, info.value.param) == (400, "guided_json")
        assert "nested more than 128 levels" in info.value.message
        with pytest.raises(InvalidRequestError) as info:
            free_json_text({"maximum": 10**30}, "guided_json")
        assert info.value.param == "guided_json"

    def test_a_body_too_deep_to_decode_is_invalid_json(self) -> None:
        depth = 5000
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
        body += b'"chat_template_kwargs": {"a": ' + b"[" * depth + b"]" * depth + b"}}"
        err = chat_error(body)
        assert err.code == "invalid_json" and "nested too deeply" in err.message

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            (
                {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                "response_format.json_schema.schema",
            ),
            ({"guided_json": {}}, "guided_json"),
            ({"structured_outputs": {"json": {}}}, "structured_outputs.json"),
            ({"structured_outputs": {"structural_tag": {}}}, "structured_outputs.structural_tag"),
            ({"chat_template_kwargs": {}}, "chat_template_kwargs"),
            ({"tools": [TOOL, TOOL]}, "tools[1].function.parameters"),
        ],
    )
    def test_each_free_form_field_is_named(self, fields: dict[str, Any], param: str) -> None:
        deep = nested(MAX_FREE_JSON_DEPTH + 1)
        key, value = next(iter(fields.items()))
        if key == "response_format":
            value["json_schema"]["schema"] = {"a": deep}
        elif key == "structured_outputs":
            (inner,) = value
            value[inner] = {"a": deep}
        elif key == "tools":
            value = [TOOL, {"type": "function", "function": {"name": "g", "parameters": deep}}]
        else:
            value = {"a": deep}
        assert chat_error(chat(**{key: value})).param == param
        # one level less passes
        shallow = nested(MAX_FREE_JSON_DEPTH - 1)
        if key == "tools":
            value[1]["function"]["parameters"] = {"a": shallow}
        elif key == "response_format":
            value["json_schema"]["schema"] = {"a": shallow}
        elif key == "structured_outputs":
            value[inner] = {"a": shallow}
        else:
            value = {"a": shallow}
        parse_chat_completion(chat(**{key: value}))

    def test_completion_guided_json(self) -> None:
        err = completion_error(completion(guided_json={"a": nested(MAX_FREE_JSON_DEPTH + 1)}))
        assert err.param == "guided_json"


class TestNeedsStreamOrTools:
    @pytest.mark.parametrize("options", [{"include_usage": True}, {"include_usage": False}, {}])
    def test_stream_options_without_stream(self, options: dict[str, Any]) -> None:
        for stream in (_DROP, False):
            err = chat_error(chat(stream=stream, stream_options=options))
            assert err.param == "stream_options"
            err = completion_error(completion(stream=stream, stream_options=options))
            assert err.param == "stream_options"

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"tool_choice": "auto"}, "tool_choice"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
            ({"parallel_tool_calls": False}, "parallel_tool_calls"),
            ({"parallel_tool_calls": True, "tools": []}, "parallel_tool_calls"),
        ],
    )
    def test_tool_fields_without_tools(self, fields: dict[str, Any], param: str) -> None:
        assert chat_error(chat(**fields)).param == param

    def test_a_tool_message_needs_its_tool_call_id(self) -> None:
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "sunny"},
        ]
        err = chat_error(chat(messages=messages))
        assert (err.code, err.param) == ("missing_field", "messages[2].tool_call_id")
        messages[2]["tool_call_id"] = "c1"
        parse_chat_completion(chat(messages=messages))

    def test_tool_choice_none_without_tools(self) -> None:
        assert parse_chat_completion(chat(tool_choice="none")).tool_choice == "none"


class TestChatErrors:
    @pytest.mark.parametrize("body", [b"{", b"", b"not json", b'{"model": "m",}', b"\xff"])
    def test_malformed_json(self, body: bytes) -> None:
        err = chat_error(body)
        assert err.code == "invalid_json"
        assert "JSON" in err.message

    @pytest.mark.parametrize("body", [b"[]", b'"x"', b"3", b"null"])
    def test_body_not_an_object(self, body: bytes) -> None:
        err = chat_error(body)
        assert err.code == "invalid_json"
        assert "JSON object" in err.message

    @pytest.mark.parametrize("field", ["model", "messages"])
    def test_missing_field(self, field: str) -> None:
        err = chat_error(chat(**{field: _DROP}))
        assert (err.code, err.param) == ("missing_field", field)
        assert field in err.message

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"model": 3}, "model"),
            ({"model": ""}, "model"),
            ({"messages": "hi"}, "messages"),
            ({"messages": []}, "messages"),
            ({"messages": ["hi"]}, "messages[0]"),
            ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
            ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
            ({"messages": [{"role": "user", "content": "x", "name": 1}]}, "messages[0].name"),
            ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]"),
            (
                {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
                "messages[0].content[0].text",
            ),
            ({"max_tokens": 0}, "max_tokens"),
            ({"max_tokens": -5}, "max_tokens"),
            ({"max_tokens": 1.5}, "max_tokens"),
            ({"max_tokens": "10"}, "max_tokens"),
            ({"max_completion_tokens": 0}, "max_completion_tokens"),
            ({"temperature": 2.5}, "temperature"),
            ({"temperature": -0.1}, "temperature"),
            ({"temperature": "hot"}, "temperature"),
            ({"temperature": True}, "temperature"),
            ({"top_p": 0}, "top_p"),
            ({"top_p": 1.01}, "top_p"),
            ({"top_k": 0}, "top_k"),
            ({"top_k": -2}, "top_k"),
            ({"top_k": 2.0}, "top_k"),
            ({"min_tokens": -1}, "min_tokens"),
            ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
            ({"seed": "1"}, "seed"),
            ({"seed": 2**63}, "seed"),
            ({"seed": 2**31}, "seed"),
            ({"top_k": 2**31}, "top_k"),
            ({"max_tokens": 2**31}, "max_tokens"),
            ({"repetition_penalty": 1e39}, "repetition_penalty"),
            ({"stop": 3}, "stop"),
            ({"stop": ["a", 1]}, "stop[1]"),
            ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
            ({"n": 0}, "n"),
            ({"n": 129}, "n"),
            ({"n": "1"}, "n"),
            ({"presence_penalty": 2.1}, "presence_penalty"),
            ({"frequency_penalty": -3}, "frequency_penalty"),
            ({"repetition_penalty": 0}, "repetition_penalty"),
            ({"repetition_penalty": -1}, "repetition_penalty"),
            ({"ignore_eos": "yes"}, "ignore_eos"),
            ({"stream": 1}, "stream"),
            ({"stream_options": True}, "stream_options"),
            ({"stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
            ({"logprobs": 1}, "logprobs"),
            ({"top_logprobs": 3}, "top_logprobs"),
            ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
            ({"logit_bias": {"x": 1}}, "logit_bias"),
            ({"logit_bias": {"5": 101}}, "logit_bias"),
            ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
            ({"tool_choice": "sometimes"}, "tool_choice"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
            (
                {"tools": [{"type": "function", "function": {"name": "a b"}}]},
                "tools[0].function.name",
            ),
            ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
            ({"response_format": {"type": "yaml"}}, "response_format.type"),
            ({"response_format": {"type": "json_object"}, "regex": "a+"}, "regex"),
            ({"structured_outputs": {"regex": "a", "choice": ["x"]}}, "structured_outputs"),
            ({"guided_json": "not json"}, "guided_json"),
            ({"reasoning_effort": "extreme"}, "reasoning_effort"),
            ({"modalities": ["audio"]}, "modalities[0]"),
            ({"service_tier": "priority"}, "service_tier"),
            ({"store": True}, "store"),
            ({"metadata": {"k": "v"}}, "metadata"),
            ({"continue_final_message": True}, "continue_final_message"),
        ],
    )
    def test_invalid_value(self, fields: dict[str, Any], param: str) -> None:
        err = chat_error(chat(**fields))
        assert err.code in ("invalid_value", "invalid_type", "unsupported_value")
        assert err.param == param
        assert param in err.message

    def test_missing_role_and_content(self) -> None:
        err = chat_error(chat(messages=[{"content": "x"}]))
        assert (err.code, err.param) == ("missing_field", "messages[0].role")
        err = chat_error(chat(messages=[{"role": "user"}]))
        assert (err.code, err.param) == ("missing_field", "messages[0].content")
        err = chat_error(chat(messages=[{"role": "user", "content": [{"text": "x"}]}]))
        assert (err.code, err.param) == ("missing_field", "messages[0].content[0].type")

    def test_unknown_fields_are_rejected_by_name(self) -> None:
        """Never accepted and silently dropped: an undeclared field is a 400 naming it."""
        err = chat_error(chat(some_unknown_key={"x": 1}))
        assert (err.code, err.param) == ("unknown_field", "some_unknown_key")
        assert "some_unknown_key" in err.message
        err = chat_error(chat(messages=[{"role": "user", "content": "x", "colour": "red"}]))
        assert (err.code, err.param) == ("unknown_field", "messages[0].colour")

    def test_messages_are_precise(self) -> None:
        err = chat_error(chat(temperature=3))
        assert err.message == "Invalid value for 'temperature': Expected `float` <= 2.0."
        err = chat_error(chat(temperature="hot"))
        assert err.message == (
            "Invalid type for 'temperature': expected float | null, but got str instead."
        )
        err = chat_error(chat(top_logprobs=3))
        assert "requires 'logprobs'" in err.message

    def test_image_parts_rejected(self) -> None:
        content = [{"type": "image_url", "image_url": {"url": "http://x"}}]
        err = chat_error(chat(messages=[{"role": "user", "content": content}]))
        assert err.param == "messages[0].content[0].type"
        assert "image_url" in err.message

    def test_big_integer_is_rejected(self) -> None:
        body = chat().replace(b'"model"', b'"max_tokens":18446744073709551616,"model"')
        err = chat_error(body)
        assert err.param == "max_tokens"


class TestCompletion:
    @pytest.mark.parametrize(
        ("prompt", "expected"),
        [
            ("hello", "hello"),
            (["hello"], "hello"),
            ([1, 2, 3], (1, 2, 3)),
            ([[4, 5]], (4, 5)),
        ],
    )
    def test_prompt_forms(self, prompt: Any, expected: Any) -> None:
        req = parse_completion(completion(prompt=prompt, max_tokens=4, stream=True))
        assert req.prompt == expected
        assert req.sampling.max_tokens == 4 and req.stream is True

    def test_missing_prompt(self) -> None:
        err = completion_error(completion(prompt=_DROP))
        assert (err.code, err.param) == ("missing_field", "prompt")

    def test_missing_model(self) -> None:
        err = completion_error(completion(model=_DROP))
        assert (err.code, err.param) == ("missing_field", "model")

    @pytest.mark.parametrize(
        ("prompt", "param"),
        [
            ("", "prompt"),
            ([], "prompt"),
            ([""], "prompt[0]"),
            ([[]], "prompt[0]"),
            ([2**31], "prompt[0]"),
            (["a", 1], "prompt[1]"),
            ([[1], "b"], "prompt[1]"),
            ([1, "a"], "prompt[1]"),
            ([1, -1], "prompt[1]"),
            ([1, 2.0], "prompt[1]"),
            ([[1, True]], "prompt[0][1]"),
            ([{"a": 1}], "prompt[0]"),
            (5, "prompt"),
        ],
    )
    def test_bad_prompt(self, prompt: Any, param: str) -> None:
        err = completion_error(completion(prompt=prompt))
        assert err.code in ("invalid_value", "invalid_type")
        assert err.param == param

    def test_batched_prompts(self) -> None:
        assert parse_completion(completion(prompt=["a", "b"])).prompts == ("a", "b")
        assert parse_completion(completion(prompt=[[1], [2, 3]])).prompts == ((1,), (2, 3))

    def test_the_batch_bound_is_on_prompts_not_on_one_prompts_ids(self) -> None:
        long_ids = list(range(1000))
        assert parse_completion(completion(prompt=long_ids)).prompts == (tuple(long_ids),)
        err = completion_error(completion(prompt=["a"] * 257))
        assert (err.code, err.param) == ("invalid_value", "prompt")

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"logprobs": 21}, "logprobs"),
            ({"best_of": 2, "n": 3}, "best_of"),
            ({"best_of": 3, "stream": True}, "best_of"),
            ({"suffix": "x"}, "suffix"),
            ({"max_tokens": 0}, "max_tokens"),
            # max_completion_tokens is a chat field: on completions it is an unknown key.
        ],
    )
    def test_unsupported(self, fields: dict[str, Any], param: str) -> None:
        err = completion_error(completion(**fields))
        assert err.code in ("invalid_value", "unsupported_value")
        assert err.param == param

    def test_completion_extras(self) -> None:
        req = parse_completion(completion(logprobs=2, echo=True, best_of=3, n=2, suffix=None))
        assert (req.logprobs, req.echo, req.best_of, req.sampling.n) == (2, True, 3, 2)
        assert parse_completion(completion()).best_of == 1


class TestSurface:
    """The fields that take effect: carried into the request types (the stages act on them)."""

    def test_tools_and_tool_choice(self) -> None:
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
        req = parse_chat_completion(chat(tools=[tool]))
        assert req.tools == (tool,) and req.tool_choice is None
        named = {"type": "function", "function": {"name": "get_weather"}}
        req = parse_chat_completion(
            chat(tools=[tool], tool_choice=named, parallel_tool_calls=False)
        )
        assert req.tool_choice == named and req.parallel_tool_calls is False

    def test_history_with_tool_calls(self) -> None:
        call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        ]
        req = parse_chat_completion(chat(messages=messages))
        assert req.messages[1]["tool_calls"] == [call]
        assert req.messages[2] == {"role": "tool", "content": "42", "tool_call_id": "call_1"}

    @pytest.mark.parametrize(
        ("fields", "kind"),
        [
            ({"response_format": {"type": "json_object"}}, "json_object"),
            (
                {
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "x", "schema": {"type": "object"}},
                    }
                },
                "json_schema",
            ),
            ({"regex": "[a-z]+"}, "regex"),
            ({"ebnf": "root ::= 'a'"}, "ebnf"),
            ({"guided_choice": ["yes", "no"]}, "choice"),
            ({"structured_outputs": {"json": {"type": "object"}}}, "json_schema"),
            ({"response_format": {"type": "text"}}, None),
        ],
    )
    def test_constraints(self, fields: dict[str, Any], kind: str | None) -> None:
        constraint = parse_chat_completion(chat(**fields)).sampling.constraint
        assert (constraint.kind if constraint else None) == kind

    def test_sampling_extras(self) -> None:
        s = parse_chat_completion(
            chat(n=3, logit_bias={"12": -100}, stop_token_ids=[5, 5, 6], skip_special_tokens=False)
        ).sampling
        assert (s.n, s.logit_bias, s.stop_token_ids, s.skip_special_tokens) == (
            3,
            ((12, -100.0),),
            (5, 6),
            False,
        )

    def test_logprobs_and_template_switches(self) -> None:
        req = parse_chat_completion(
            chat(
                logprobs=True,
                top_logprobs=4,
                chat_template_kwargs={"enable_thinking": False},
                separate_reasoning=False,
                service_tier="auto",
                store=False,
            )
        )
        assert (req.logprobs, req.top_logprobs) == (True, 4)
        assert req.template_kwargs == {"enable_thinking": False}
        assert req.separate_reasoning is False

    def test_continue_final_message(self) -> None:
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
        req = parse_chat_completion(
            chat(messages=messages, continue_final_message=True, add_generation_prompt=False)
        )
        assert req.continue_final_message and not req.add_generation_prompt

    def test_max_completion_tokens_is_unknown_here(self) -> None:
        err = completion_error(completion(max_completion_tokens=3))
        assert (err.code, err.param) == ("unknown_field", "max_completion_tokens")


class TestCheckMaxTokens:
    def test_names_the_field_the_client_used(self) -> None:
        for param in ("max_tokens", "max_completion_tokens"):
            with pytest.raises(InvalidRequestError) as info:
                check_max_tokens(4096, 4096, param)
            err = info.value
            assert (err.status, err.code, err.param) == (400, "context_length_exceeded", param)
            assert "at most 4095" in err.message

    def test_room_for_a_prompt_token_passes(self) -> None:
        check_max_tokens(4095, 4096, "max_tokens")
        check_max_tokens(None, 4096, "max_tokens")

    def test_chat_records_which_field(self) -> None:
        req = parse_chat_completion(chat(max_completion_tokens=5))
        assert (req.sampling.max_tokens, req.sampling.max_tokens_param) == (
            5,
            "max_completion_tokens",
        )
        req = parse_chat_completion(chat(max_tokens=5))
        assert req.sampling.max_tokens_param == "max_tokens"


class TestCheckContext:
    def test_fits(self) -> None:
        assert check_context(10, 20, 30) == 20
        assert check_context(10, None, 30) == 20

    def test_prompt_plus_completion_too_long(self) -> None:
        with pytest.raises(InvalidRequestError) as info:
            check_context(100, 4000, 4096)
        err = info.value
        assert (err.status, err.code, err.param) == (400, "context_length_exceeded", "messages")
        assert err.message.startswith(
            "This model's maximum context length is 4096 tokens. However, you requested "
            "4100 tokens (100 in the messages, 4000 in the completion)."
        )

    def test_prompt_alone_fills_context(self) -> None:
        with pytest.raises(InvalidRequestError) as info:
            check_context(4096, None, 4096)
        assert info.value.code == "context_length_exceeded"
        assert "4096 tokens" in info.value.message
        with pytest.raises(InvalidRequestError):
            check_context(4096, 1, 4096)

    def test_exact_fit(self) -> None:
        assert check_context(4095, 1, 4096) == 1
        assert check_context(4095, None, 4096) == 1

    def test_prompt_wording(self) -> None:
        with pytest.raises(InvalidRequestError) as info:
            check_context(10, 10, 15, param="prompt")
        assert info.value.param == "prompt"
        assert "(10 in the prompt, 10 in the completion)" in info.value.message


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"user": "u"}, "u"),
        ({"user": "u", "safety_identifier": "s"}, "s"),
        ({"user": "u", "safety_identifier": "s", "prompt_cache_key": "k"}, "k"),
        ({}, None),
    ],
)
def test_the_session_key_is_the_cache_key_else_the_end_user(
    fields: dict[str, Any], key: str | None
) -> None:
    assert parse_chat_completion(chat(**fields)).user == key
