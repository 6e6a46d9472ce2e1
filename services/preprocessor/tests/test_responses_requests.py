"""The Responses API's parse stage: input items -> chat messages, tools and tool_choice ->
chat's shapes, text.format -> the engine constraint, and every field that cannot take effect
refused with a 400 naming it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from switchyard.preprocessor.errors import InvalidRequestError, RequestError
from switchyard.preprocessor.responses_requests import parse_responses, responses_error
from switchyard.protos.messages import CONSTRAINT_JSON_OBJECT, CONSTRAINT_JSON_SCHEMA


def parse(**fields: Any):
    body: dict[str, Any] = {"model": "m", "input": "hi"}
    body.update(fields)
    return parse_responses(orjson.dumps(body))


def refused(**fields: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        parse(**fields)
    assert info.value.status == 400
    return info.value


TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


class TestInput:
    def test_string_and_instructions(self):
        req = parse(input="What now?", instructions="Be brief.")
        assert req.messages == (
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What now?"},
        )

    def test_message_items_with_and_without_type(self):
        req = parse(
            input=[
                {"role": "developer", "content": "rules"},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "c", "annotations": []}]},
            ]
        )  # fmt: skip
        assert req.messages == (
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": "a\nb"},
            {"role": "assistant", "content": "c"},
        )

    def test_a_tool_loop_becomes_tool_calls_and_tool_messages(self):
        req = parse(
            input=[
                {"role": "user", "content": "weather?"},
                {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "look it up"}]},
                {"type": "message", "role": "assistant", "content": "Let me check."},
                {"type": "function_call", "call_id": "c1", "name": "get_weather",
                 "arguments": '{"city": "Paris"}', "id": "fc_1", "status": "completed"},
                {"type": "function_call", "call_id": "c2", "name": "get_weather",
                 "arguments": '{"city": "Rome"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "c2",
                 "output": [{"type": "input_text", "text": "rain"}]},
            ],
            tools=[TOOL],
        )  # fmt: skip
        user, assistant, first, second = req.messages
        assert assistant == {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "look it up",
            "tool_calls": [
                {"type": "function", "id": "c1",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"type": "function", "id": "c2",
                 "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            ],
        }  # fmt: skip
        assert first == {"role": "tool", "content": "sunny", "tool_call_id": "c1",
                         "name": "get_weather"}  # fmt: skip
        assert second["content"] == "rain"

    def test_a_call_after_a_tool_result_opens_a_new_assistant_message(self):
        req = parse(
            input=[
                {"role": "user", "content": "q"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "r"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
            ]
        )
        roles = [m["role"] for m in req.messages]
        assert roles == ["user", "assistant", "tool", "assistant"]
        assert "content" not in req.messages[1]  # a call alone: as chat's null content

    @pytest.mark.parametrize(
        "item,param",
        [
            ({"role": "user", "content": [{"type": "input_image", "image_url": "u"}]},
             "input[0].content[0].type"),
            ({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
             "input[0].content[0].type"),
            ({"type": "item_reference", "id": "msg_1"}, "input[0].type"),
            ({"type": "web_search_call", "id": "ws"}, "input[0].type"),
            ({"type": "reasoning", "summary": [], "encrypted_content": "x"},
             "input[0].encrypted_content"),
            ({"role": "user", "content": "x", "extra": 1}, "input[0].extra"),
            ({"role": "tool", "content": "x"}, "input[0].role"),
            ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[0].call_id"),
            ({"type": "function_call_output", "call_id": "c",
              "output": [{"type": "input_image", "image_url": "u"}]}, "input[0].output[0].type"),
            ("just a string", "input[0]"),
        ],
    )  # fmt: skip
    def test_refused_items_are_named(self, item, param):
        assert refused(input=[item]).param == param

    def test_empty_input_list(self):
        assert refused(input=[]).param == "input"


class TestTools:
    def test_flat_function_tools_become_chat_tools(self):
        req = parse(tools=[{**TOOL, "description": "d", "strict": True}])
        assert req.tools == (
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "d",
                    "parameters": {"type": "object"},
                    "strict": True,
                },
            },
        )
        assert req.shown["tools"] == [{**TOOL, "description": "d", "strict": True}]

    @pytest.mark.parametrize(
        "choice,expected",
        [
            ("auto", "auto"),
            ("none", "none"),
            ("required", "required"),
            ({"type": "function", "name": "get_weather"},
             {"type": "function", "function": {"name": "get_weather"}}),
        ],
    )  # fmt: skip
    def test_tool_choice(self, choice, expected):
        req = parse(tools=[TOOL], tool_choice=choice)
        assert req.tool_choice == expected
        assert req.shown["tool_choice"] == choice

    @pytest.mark.parametrize(
        "fields,param",
        [
            ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
            ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type"),
            ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type"),
            ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].function"),
            ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
            ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}},
             "tool_choice"),
            ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "mode": "auto",
                                                "tools": []}}, "tool_choice"),
            ({"tool_choice": "required"}, "tool_choice"),
        ],
    )  # fmt: skip
    def test_refused(self, fields, param):
        assert refused(**fields).param == param

    def test_parallel_tool_calls(self):
        assert parse(tools=[TOOL]).parallel_tool_calls is True
        assert parse(tools=[TOOL], parallel_tool_calls=False).parallel_tool_calls is False


class TestSampling:
    def test_fields(self):
        req = parse(max_output_tokens=20, temperature=0.5, top_p=0.9, stream=True)
        assert req.sampling.max_tokens == 20 and req.stream
        assert (req.sampling.temperature, req.sampling.top_p, req.sampling.n) == (0.5, 0.9, 1)
        assert req.shown["temperature"] == 0.5 and req.shown["max_output_tokens"] == 20

    def test_text_format(self):
        assert parse().sampling.constraint is None
        assert parse(text={"format": {"type": "text"}}).sampling.constraint is None
        req = parse(text={"format": {"type": "json_object"}})
        assert req.sampling.constraint.kind == CONSTRAINT_JSON_OBJECT
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        req = parse(text={"format": {"type": "json_schema", "name": "t", "schema": schema}})
        assert req.sampling.constraint.kind == CONSTRAINT_JSON_SCHEMA
        assert orjson.loads(req.sampling.constraint.value) == schema
        assert req.sampling.constraint_param == "text.format"

    def test_reasoning_effort_goes_to_the_template(self):
        assert parse(reasoning={"effort": "low"}).template_kwargs == {"reasoning_effort": "low"}
        assert parse().template_kwargs == {}

    def test_hints_and_neutral_values_are_accepted(self):
        parse(store=False, truncation="disabled", service_tier="auto", background=False,
              include=[], prompt_cache_key="k", safety_identifier="s", user="u",
              stream_options={"include_obfuscation": False})  # fmt: skip


class TestRefusals:
    @pytest.mark.parametrize(
        "fields,param",
        [
            ({"previous_response_id": ""}, "previous_response_id"),
            ({"conversation": {"id": "conv_1", "x": 1}}, "conversation"),
            ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
            ({"conversation": "conv_1", "store": False}, "store"),
            ({"background": True}, "background"),
            ({"include": ["reasoning.encrypted_content"]}, "include"),
            ({"truncation": "auto"}, "truncation"),
            ({"prompt": {"id": "pmpt_1"}}, "prompt"),
            ({"top_logprobs": 2}, "top_logprobs"),
            ({"max_tool_calls": 2}, "max_tool_calls"),
            ({"service_tier": "flex"}, "service_tier"),
            ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
            ({"text": {"verbosity": "low"}}, "text.verbosity"),
            ({"stream_options": {"include_obfuscation": True}},
             "stream_options.include_obfuscation"),
            ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
            ({"max_output_tokens": 0}, "max_output_tokens"),
            ({"temperature": 3}, "temperature"),
            ({"n": 2}, "n"),
            ({"some_future_field": 1}, "some_future_field"),
            ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ],
    )  # fmt: skip
    def test_named(self, fields, param):
        assert refused(**fields).param == param

    def test_state_fields_are_carried(self):
        """store, previous_response_id and conversation take effect in stages/stored."""
        req = parse_responses(
            b'{"model": "m", "input": "hi", "instructions": "be brief", "store": true, '
            b'"previous_response_id": "resp_1"}'
        )
        assert (req.store, req.previous_response_id, req.conversation) == (True, "resp_1", None)
        assert req.head == 1 and req.input == "hi"
        req = parse_responses(b'{"model": "m", "input": "hi", "conversation": {"id": "conv_1"}}')
        assert (req.store, req.conversation, req.head) == (None, "conv_1", 0)

    def test_missing_input(self):
        with pytest.raises(InvalidRequestError) as info:
            parse_responses(b'{"model": "m"}')
        assert info.value.param == "input" and info.value.code == "missing_field"


class TestErrorNames:
    def test_chat_fields_are_renamed(self):
        err = responses_error(
            InvalidRequestError(
                "However, your messages resulted in 9 tokens. Please reduce the length of "
                "the messages.",
                "context_length_exceeded",
                "messages",
            )
        )
        assert err.param == "input" and "messages" not in err.message
        err = responses_error(
            InvalidRequestError("'reasoning_effort' is not used.", param="reasoning_effort")
        )
        assert (err.param, err.message) == ("reasoning.effort", "'reasoning.effort' is not used.")

    def test_other_errors_are_unchanged(self):
        err = RequestError(503, "busy", "service_unavailable", "overloaded")
        assert responses_error(err) is err
        err = InvalidRequestError("x", param="tool_choice")
        assert responses_error(err) is err


class TestNesting:
    """Free-form values the response object echoes or the engine gets as JSON text: nested
    deeper than MAX_FREE_JSON_DEPTH, a 400 naming them (orjson writes at most 254 levels)."""

    @staticmethod
    def deep(depth: int) -> Any:
        value: Any = 1
        for _ in range(depth):
            value = [value]
        return {"enum": [value]}

    def test_tool_parameters(self):
        from switchyard.preprocessor.openai_requests import MAX_FREE_JSON_DEPTH

        ok = dict(TOOL, parameters=self.deep(MAX_FREE_JSON_DEPTH - 2))
        assert parse(tools=[TOOL, ok]).tools
        bad = dict(TOOL, parameters=self.deep(MAX_FREE_JSON_DEPTH))
        assert refused(tools=[TOOL, bad]).param == "tools[1].parameters"

    def test_text_format_schema(self):
        fmt = {"type": "json_schema", "name": "x", "schema": self.deep(200)}
        assert refused(text={"format": fmt}).param == "text.format.schema"

    def test_a_body_too_deep_to_decode(self):
        body = b'{"model": "m", "input": [' + b"[" * 5000 + b"]" * 5000 + b"]}"
        with pytest.raises(InvalidRequestError) as info:
            parse_responses(body)
        assert info.value.code == "invalid_json"
