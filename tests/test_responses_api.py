"""POST /v1/responses end to end with the openai SDK through the real stack, on both engine
protocols (issue 10): text answers, a tool loop (function_call -> function_call_output ->
answer) streaming and not for three parser families, required and named tool_choice,
reasoning items, text.format json_schema (and the SDK's `responses.parse`), the streamed
event sequence, incomplete answers, and the fields refused by name.

The mock engines are test_openai_surface's families (same templates and scripts, each model
writing its family's own markup, tokenized with the real tokenizer).
"""

from __future__ import annotations

import json

import httpx
import openai
import pydantic
import pytest
from test_openai_surface import (
    ANSWER,
    ARGS,
    FAMILIES,
    QUESTION,
    THINKING,
    TOOL_RESULT,
    family_stack,
    no_markup,
)

MODELS = ("ds-v3", "qwen3", "ds-r1")  # DeepSeek-V3 markup, Hermes markup, R1 reasoning
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {
        "type": "function",
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
]


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def stack(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"responses-{request.param}")
    with family_stack(request.param, tmp, MODELS, embed=False) as s:
        yield s


def types_of(response) -> list[str]:
    return [item.type for item in response.output]


def streamed(events) -> tuple[list, object]:
    """(every event, the final response) of a `create(stream=True)` stream."""
    got = list(events)
    assert [e.sequence_number for e in got] == list(range(len(got)))
    assert got[0].type == "response.created" and got[1].type == "response.in_progress"
    return got, got[-1].response


class TestText:
    def test_plain_answer(self, stack):
        reply = stack.client.responses.create(
            model="ds-v3",
            input="say something",
            instructions="Be brief.",
            max_output_tokens=8,
            temperature=0,  # a sampled answer can be EOS alone: no text
        )
        assert reply.object == "response" and reply.id.startswith("resp_")
        assert reply.status in ("completed", "incomplete")
        assert reply.output_text
        assert reply.instructions == "Be brief." and reply.max_output_tokens == 8
        usage = reply.usage
        assert 0 < usage.output_tokens <= 8 and usage.input_tokens > 0
        assert usage.total_tokens == usage.input_tokens + usage.output_tokens

    def test_max_output_tokens_makes_it_incomplete(self, stack):
        reply = stack.client.responses.create(
            model="ds-v3", input=QUESTION, max_output_tokens=3
        )  # the script's answer is longer than 3 tokens
        assert reply.status == "incomplete"
        assert reply.incomplete_details.reason == "max_output_tokens"
        assert reply.usage.output_tokens == 3
        events, final = streamed(
            stack.client.responses.create(
                model="ds-v3", input=QUESTION, max_output_tokens=3, stream=True
            )
        )
        assert events[-1].type == "response.incomplete" and final.status == "incomplete"

    def test_streamed_event_sequence(self, stack):
        events, final = streamed(
            stack.client.responses.create(
                model="ds-v3",
                input="say something",
                max_output_tokens=12,
                stream=True,
                temperature=0,  # a sampled answer can be EOS alone: no text deltas
            )
        )
        kinds = [e.type for e in events]
        assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
        assert kinds[-4:-1] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
        assert set(kinds[4:-4]) == {"response.output_text.delta"}
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == final.output_text and text
        assert events[-4].text == text  # output_text.done

    def test_sdk_stream_helper(self, stack):
        with stack.client.responses.stream(
            model="ds-v3", input=TOOL_RESULT, max_output_tokens=60
        ) as stream:  # the script's answer, which ends before the limit
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
        assert "".join(deltas) == final.output_text == ANSWER


class TestToolLoop:
    @pytest.mark.parametrize("model", MODELS)
    @pytest.mark.parametrize("stream", [False, True])
    def test_call_result_answer(self, stack, model, stream):
        history: list = [{"role": "user", "content": QUESTION}]
        first = self._create(stack, stream, model=model, input=history, tools=TOOLS)
        reasoning = FAMILIES[model][2]
        expected = (["reasoning"] if reasoning else []) + ["message", "function_call"]
        assert types_of(first) == expected
        assert first.output_text == "Let me check."
        no_markup(first.output_text)
        call = first.output[-1]
        assert call.name == "get_weather" and json.loads(call.arguments) == ARGS
        assert call.call_id and call.status == "completed"
        if reasoning:
            assert first.output[0].content[0].text == reasoning
        history += first.output  # the SDK's own items, passed back as they came
        history.append(
            {"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT}
        )
        final = self._create(stack, stream, model=model, input=history, tools=TOOLS)
        assert final.output_text == ANSWER
        assert "function_call" not in types_of(final)
        # the call and its result reached the prompt: it is longer than the question's
        assert final.usage.input_tokens > first.usage.input_tokens

    @staticmethod
    def _create(stack, stream: bool, **fields):
        if not stream:
            return stack.client.responses.create(max_output_tokens=120, **fields)
        events, final = streamed(
            stack.client.responses.create(max_output_tokens=120, stream=True, **fields)
        )
        kinds = [e.type for e in events]
        for call in (e for e in events if e.type == "response.output_item.done"):
            if call.item.type == "function_call":
                args = "".join(
                    e.delta
                    for e in events
                    if e.type == "response.function_call_arguments.delta"
                    and e.item_id == call.item.id
                )
                assert args == call.item.arguments
                assert "response.function_call_arguments.done" in kinds
        assert kinds[-1] == "response.completed"
        return final

    @pytest.mark.parametrize("model", ["ds-v3", "qwen3"])
    @pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_time"}])
    def test_required_and_named(self, stack, model, tool_choice):
        """The engine is constrained to the tools' JSON: a call is certain, not hoped for."""
        reply = stack.client.responses.create(
            model=model,
            input="anything at all",
            tools=TOOLS,
            tool_choice=tool_choice,
            max_output_tokens=400,
        )
        calls = [item for item in reply.output if item.type == "function_call"]
        assert calls
        for call in calls:
            assert call.name in {"get_weather", "get_time"}
            assert isinstance(json.loads(call.arguments), dict)
        if isinstance(tool_choice, dict):
            assert [call.name for call in calls] == ["get_time"]

    @pytest.mark.parametrize("model", ["ds-v3", "qwen3"])
    @pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_time"}])
    def test_required_and_named_cut_off(self, stack, model, tool_choice):
        """Regression: a call cut off by max_output_tokens came out as an output_text item
        of raw JSON. Now function_call items (the last one's arguments truncated; an empty
        message when no call began), the response incomplete, streamed the same as not."""
        fields = dict(
            model=model,
            input="anything at all",
            tools=TOOLS,
            tool_choice=tool_choice,
            temperature=0,  # the same output every time
        )
        full = stack.client.responses.create(max_output_tokens=400, **fields)
        n = full.usage.output_tokens
        wanted = [(c.name, c.arguments) for c in full.output if c.type == "function_call"]
        for cut in sorted({n // 2, n - 1}):
            reply = stack.client.responses.create(max_output_tokens=cut, **fields)
            _, streamed_reply = streamed(
                stack.client.responses.create(max_output_tokens=cut, stream=True, **fields)
            )
            got = []
            for answer in (reply, streamed_reply):
                assert answer.status == "incomplete" and answer.output_text == "", cut
                got.append([(c.name, c.arguments) for c in answer.output if c.type != "message"])
            calls = got[0]
            assert got[1] == calls and len(calls) <= len(wanted)
            if cut == n - 1:
                assert calls and types_of(reply) == ["function_call"] * len(calls)
            for (name, arguments), (full_name, full_args) in zip(calls, wanted, strict=False):
                assert name == full_name and full_args.startswith(arguments), calls


class TestReasoning:
    @pytest.mark.parametrize("stream", [False, True])
    def test_r1_reasoning_item(self, stack, stream):
        fields = dict(model="ds-r1", input="THINK-R1 how many tracks?", max_output_tokens=60)
        if stream:
            events, reply = streamed(stack.client.responses.create(stream=True, **fields))
            deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
            assert "".join(deltas) == THINKING
        else:
            reply = stack.client.responses.create(**fields)
        assert types_of(reply) == ["reasoning", "message"]
        assert reply.output[0].content[0].text == THINKING
        assert reply.output_text == "Seven tracks."
        assert reply.usage.output_tokens_details.reasoning_tokens > 0


class Train(pydantic.BaseModel):
    track: int
    name: str


class TestStructuredOutput:
    SCHEMA = {
        "type": "object",
        "properties": {
            "track": {"type": "integer", "minimum": 1, "maximum": 9},
            "name": {"type": "string"},
        },
        "required": ["track", "name"],
        "additionalProperties": False,
    }

    @pytest.mark.parametrize("stream", [False, True])
    def test_json_schema(self, stack, stream):
        fmt = {"type": "json_schema", "name": "train", "schema": self.SCHEMA, "strict": True}
        fields = dict(
            model="ds-v3", input="a train as JSON", text={"format": fmt}, max_output_tokens=300
        )
        if stream:
            _, reply = streamed(stack.client.responses.create(stream=True, **fields))
        else:
            reply = stack.client.responses.create(**fields)
        value = json.loads(reply.output_text)
        assert set(value) == {"track", "name"} and 1 <= value["track"] <= 9
        assert reply.text.format.type == "json_schema"

    def test_sdk_parse(self, stack):
        reply = stack.client.responses.parse(
            model="ds-v3", input="a train", text_format=Train, max_output_tokens=300
        )
        assert isinstance(reply.output_parsed, Train)


class TestRefusals:
    @pytest.mark.parametrize(
        "fields,param",
        [
            ({"previous_response_id": "resp_123"}, "previous_response_id"),  # not found
            ({"background": True}, "background"),
            ({"include": ["reasoning.encrypted_content"]}, "include"),
            ({"truncation": "auto"}, "truncation"),
            ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
            ({"reasoning": {"effort": "high"}}, "reasoning.effort"),  # not in V3's template
            ({"input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"}]}]},
             "input[0].content[0].type"),
            ({"extra_body": {"some_future_field": 1}}, "some_future_field"),
        ],
    )  # fmt: skip
    def test_named(self, stack, fields, param):
        fields = {"model": "ds-v3", "input": "hi", "max_output_tokens": 4, **fields}
        with pytest.raises(openai.BadRequestError) as info:
            stack.client.responses.create(**fields)
        assert info.value.body["param"] == param

    def test_unknown_model(self, stack):
        with pytest.raises(openai.NotFoundError):
            stack.client.responses.create(model="nope", input="hi")

    def test_store_false_is_not_kept(self, stack):
        """Kept by default (tests/test_stored_responses.py); `store: false` leaves nothing."""
        reply = stack.client.responses.create(
            model="ds-v3", input="hi", max_output_tokens=2, store=False
        )
        assert reply.store is False
        with pytest.raises(openai.NotFoundError) as info:
            stack.client.responses.retrieve(reply.id)
        assert info.value.body["code"] == "response_not_found"
        with pytest.raises(openai.NotFoundError):
            stack.client.responses.delete(reply.id)

    def test_sse_frames_have_event_lines(self, stack):
        body = {"model": "ds-v3", "input": "hi", "max_output_tokens": 3, "stream": True}
        with httpx.stream("POST", stack.base_url + "/v1/responses", json=body, timeout=60) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            frames = [f for f in r.read().decode().split("\n\n") if f]
        for frame in frames:
            event, data = frame.split("\n", 1)
            assert event.startswith("event: ") and data.startswith("data: ")
            assert json.loads(data[6:])["type"] == event[7:]
