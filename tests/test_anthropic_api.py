"""POST /v1/messages and /v1/messages/count_tokens end to end with the anthropic SDK,
unmodified, through the real stack on both engine protocols: text answers (system,
stop_sequences, max_tokens), streams (text, tool use, thinking), a tool loop with
tool_result for two tool-call families, thinking on a reasoning model, count_tokens equal to
what a message bills, and errors in Anthropic's shape. Also /tokenize and /detokenize: counts
equal to usage.prompt_tokens, and round trips.

The mock engines are test_openai_surface's families (same templates and scripts, each model
writing its family's own markup at real token boundaries).
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from test_openai_surface import (
    ANSWER,
    ARGS,
    QUESTION,
    THINKING,
    TOOL_RESULT,
    family_stack,
    no_markup,
)

MODELS = ("ds-v3", "qwen3", "ds-r1")  # DeepSeek-V3 markup, Hermes markup, R1 reasoning
TOOL_MODELS = ("ds-v3", "qwen3")
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {
        "name": "get_time",
        "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
]


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def stack(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"anthropic-{request.param}")
    with family_stack(request.param, tmp, MODELS, embed=False) as s:
        s.anthropic = anthropic.Anthropic(base_url=s.base_url, api_key="x", max_retries=0)
        try:
            yield s
        finally:
            s.anthropic.close()


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def billed(message) -> int:
    usage = message.usage
    return (
        usage.input_tokens
        + (usage.cache_read_input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0)
    )


class TestCreate:
    def test_text(self, stack):
        message = stack.anthropic.messages.create(
            model="ds-v3",
            max_tokens=8,
            system="Be brief.",
            messages=user("say something"),
            extra_body={"temperature": 0},  # sampling fields the SDK no longer names
        )
        assert message.type == "message" and message.role == "assistant"
        assert message.id.startswith("msg_") and message.model == "ds-v3"
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert [b.type for b in message.content] in ([], ["text"])
        assert 1 <= message.usage.output_tokens <= 8

    def test_max_tokens(self, stack):
        message = stack.anthropic.messages.create(
            model="ds-v3", max_tokens=3, messages=user("a long story"),
            extra_body={"top_k": 1},
        )  # fmt: skip
        if message.stop_reason != "end_turn":  # greedy EOS first: nothing to cut
            assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3

    def test_stop_sequence(self, stack):
        # The scripted answer to the question is "Let me check." + the call's markup.
        message = stack.anthropic.messages.create(
            model="ds-v3", max_tokens=64, messages=user(QUESTION), stop_sequences=["check"]
        )
        assert message.stop_reason == "stop_sequence" and message.stop_sequence == "check"
        assert message.content[0].text == "Let me "

    def test_system_blocks(self, stack):
        """A system prompt as text blocks is the same prompt as the string they join to; it
        is billed (count_tokens agrees)."""
        blocks = [
            {"type": "text", "text": "Be brief."},
            {"type": "text", "text": "Answer in English.", "cache_control": {"type": "ephemeral"}},
        ]
        bare = stack.anthropic.messages.count_tokens(model="ds-v3", messages=user("hello"))
        counted = stack.anthropic.messages.count_tokens(
            model="ds-v3", messages=user("hello"), system=blocks
        )
        assert counted.input_tokens > bare.input_tokens
        message = stack.anthropic.messages.create(
            model="ds-v3", max_tokens=2, messages=user("hello"), system=blocks
        )
        assert billed(message) == counted.input_tokens

    def test_request_id_header(self, stack):
        raw = stack.anthropic.messages.with_raw_response.create(
            model="ds-v3", max_tokens=2, messages=user("hi")
        )
        assert raw.request_id == raw.parse().id


class TestStream:
    def test_text(self, stack):
        with stack.anthropic.messages.stream(
            model="ds-v3", max_tokens=12, messages=user("tell me more"),
            extra_body={"temperature": 0},
        ) as stream:  # fmt: skip
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert final.content[0].text == text if final.content else text == ""
        assert final.usage.output_tokens >= 1
        assert final.stop_reason in ("end_turn", "max_tokens")

    def test_raw_events_in_order(self, stack):
        events = list(
            stack.anthropic.messages.create(
                model="ds-v3", max_tokens=6, messages=user("go on"), stream=True,
                extra_body={"top_k": 1},
            )
        )  # fmt: skip
        kinds = [e.type for e in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        blocks = [i for i, k in enumerate(kinds) if k == "content_block_start"]
        for at in blocks:
            assert "content_block_stop" in kinds[at:]

    def test_every_event_and_delta_type(self, stack):
        """The raw SSE frames (the SDK drops `ping` before its iterators see it): thinking,
        text and a tool's input in one answer, each `event:` naming its data's type."""
        with stack.anthropic.messages.with_streaming_response.create(
            model="ds-r1", max_tokens=256, messages=user(QUESTION), tools=TOOLS, stream=True
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in response.iter_lines() if line]
        names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
        datas = [
            json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")
        ]
        assert len(names) == len(datas) and names == [d["type"] for d in datas]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
        assert "ping" in names
        started = [d["content_block"]["type"] for d in datas if d["type"] == "content_block_start"]
        assert started == ["thinking", "text", "tool_use"]
        deltas = {d["delta"]["type"] for d in datas if d["type"] == "content_block_delta"}
        assert deltas == {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"}
        assert names.count("content_block_stop") == 3
        end = datas[-2]
        assert end["delta"]["stop_reason"] == "tool_use" and end["usage"]["output_tokens"] >= 1
        assert datas[0]["message"]["usage"]["input_tokens"] >= 1

    @pytest.mark.parametrize("model", TOOL_MODELS)
    def test_tool_use(self, stack, model):
        with stack.anthropic.messages.stream(
            model=model, max_tokens=128, messages=user(QUESTION), tools=TOOLS
        ) as stream:
            events = list(stream)
            final = stream.get_final_message()
        assert final.stop_reason == "tool_use"
        text, use = final.content
        assert text.type == "text" and text.text == "Let me check."
        assert use.type == "tool_use" and use.name == "get_weather" and use.input == ARGS
        assert any(e.type == "input_json" for e in events)  # input_json_delta streamed


class TestToolLoop:
    @pytest.mark.parametrize("model", TOOL_MODELS)
    @pytest.mark.parametrize("stream", [False, True])
    def test_tool_result_then_answer(self, stack, model, stream):
        client = stack.anthropic
        first = client.messages.create(
            model=model, max_tokens=128, messages=user(QUESTION), tools=TOOLS
        )
        assert first.stop_reason == "tool_use"
        use = next(b for b in first.content if b.type == "tool_use")
        assert use.input == ARGS
        history = [
            *user(QUESTION),
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in first.content],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": TOOL_RESULT}],
            },
        ]
        if stream:
            with client.messages.stream(
                model=model, max_tokens=64, messages=history, tools=TOOLS
            ) as s:
                answer = s.get_final_message()
        else:
            answer = client.messages.create(
                model=model, max_tokens=64, messages=history, tools=TOOLS
            )
        assert answer.stop_reason == "end_turn"
        assert [b.type for b in answer.content] == ["text"]
        assert answer.content[0].text == ANSWER
        no_markup(answer.content[0].text)

    def test_tool_result_blocks_and_is_error(self, stack):
        """tool_result content as text blocks, and is_error (the model reads "Error: ...")."""
        use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": ARGS}

        def history(result: dict) -> list[dict]:
            return [
                *user(QUESTION),
                {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}, use]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", **result}],
                },
            ]

        blocks = {"content": [{"type": "text", "text": TOOL_RESULT}]}
        answer = stack.anthropic.messages.create(
            model="qwen3", max_tokens=64, messages=history(blocks), tools=TOOLS
        )
        assert answer.content[0].text == ANSWER  # the script saw the result's text
        plain = stack.anthropic.messages.count_tokens(
            model="qwen3", messages=history({"content": TOOL_RESULT}), tools=TOOLS
        )
        assert billed(answer) == plain.input_tokens  # blocks and a string: one prompt
        failed = stack.anthropic.messages.count_tokens(
            model="qwen3", messages=history({**blocks, "is_error": True}), tools=TOOLS
        )
        assert failed.input_tokens > plain.input_tokens

    @pytest.mark.parametrize(
        "choice, names",
        [
            ({"type": "tool", "name": "get_time"}, {"get_time"}),
            ({"type": "any", "disable_parallel_tool_use": True}, {"get_time", "get_weather"}),
        ],
        ids=["tool", "any"],
    )
    def test_required_tool_choice(self, stack, choice, names):
        """The engine's constraint makes the model call a tool on a prompt that asks none."""
        message = stack.anthropic.messages.create(
            model="ds-v3", max_tokens=128, messages=user("anything at all"), tools=TOOLS,
            tool_choice=choice,
        )  # fmt: skip
        uses = [b for b in message.content if b.type == "tool_use"]
        assert uses and all(u.name in names for u in uses)
        if choice.get("disable_parallel_tool_use"):
            assert len(uses) == 1
        assert message.stop_reason == "tool_use"


class TestThinking:
    def test_a_reasoning_model(self, stack):
        message = stack.anthropic.messages.create(
            model="ds-r1", max_tokens=64, messages=user("THINK-R1 how many tracks?")
        )
        thinking, text = message.content
        assert thinking.type == "thinking" and thinking.thinking == THINKING
        assert thinking.signature
        assert text.text == "Seven tracks."

    def test_streamed_with_thinking_enabled(self, stack):
        with stack.anthropic.messages.stream(
            model="qwen3",
            max_tokens=2048,
            messages=user("THINK-QWEN how many tracks?"),
            thinking={"type": "enabled", "budget_tokens": 1024},
        ) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_message()
        assert "thinking" in kinds and "signature" in kinds
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.content[0].thinking == THINKING

    def test_thinking_passed_back(self, stack):
        history = [
            *user("THINK-R1 how many tracks?"),
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": THINKING, "signature": "sig"},
                    {"type": "text", "text": "Seven tracks."},
                ],
            },
            *user("and now?"),
        ]
        message = stack.anthropic.messages.create(model="ds-r1", max_tokens=4, messages=history)
        assert message.usage.output_tokens >= 1

    def test_cannot_turn_off_a_model_that_always_reasons(self, stack):
        with pytest.raises(anthropic.BadRequestError) as err:
            stack.anthropic.messages.create(
                model="ds-r1", max_tokens=8, messages=user("hi"), thinking={"type": "disabled"}
            )
        assert err.value.body["error"]["type"] == "invalid_request_error"
        assert "thinking" in err.value.body["error"]["message"]


class TestCountTokens:
    @pytest.mark.parametrize(
        "extra",
        [
            {},
            {"system": "Be brief.", "tools": TOOLS},
            {"tools": TOOLS, "tool_choice": {"type": "any"}},
        ],
    )
    def test_equal_to_what_a_message_bills(self, stack, extra):
        messages = user(QUESTION)
        count = stack.anthropic.messages.count_tokens(model="ds-v3", messages=messages, **extra)
        message = stack.anthropic.messages.create(
            model="ds-v3", max_tokens=2, messages=messages, **extra
        )
        assert count.input_tokens == billed(message)


class TestErrors:
    def test_unknown_model(self, stack):
        with pytest.raises(anthropic.NotFoundError) as err:
            stack.anthropic.messages.create(model="nope", max_tokens=4, messages=user("x"))
        assert err.value.body == {
            "type": "error",
            "error": {"type": "not_found_error", "message": "The model 'nope' does not exist."},
        }

    @pytest.mark.parametrize(
        "extra, words",
        [
            ({"extra_body": {"unknown_thing": 1}}, "unknown_thing"),
            ({"extra_body": {"temperature": 1.5}}, "temperature"),
            ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
            ({"container": "c-1"}, "container"),
        ],
    )
    def test_bad_request(self, stack, extra, words):
        with pytest.raises(anthropic.BadRequestError) as err:
            stack.anthropic.messages.create(
                model="ds-v3", max_tokens=4, messages=user("x"), **extra
            )
        error = err.value.body["error"]
        assert error["type"] == "invalid_request_error" and words in error["message"]

    def test_max_tokens_is_required(self, stack):
        with pytest.raises(anthropic.BadRequestError) as err:  # omit: the SDK sends none
            stack.anthropic.messages.create(
                model="ds-v3", messages=user("x"), max_tokens=anthropic.omit, timeout=30
            )
        body = err.value.body
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert body["error"]["type"] == "invalid_request_error"
        assert "max_tokens" in body["error"]["message"]

    def test_streamed_request_refused_before_the_stream(self, stack):
        with pytest.raises(anthropic.BadRequestError):
            with stack.anthropic.messages.stream(
                model="ds-v3", max_tokens=100000, messages=user("x")
            ) as stream:
                list(stream)

    def test_count_tokens_errors(self, stack):
        with pytest.raises(anthropic.NotFoundError) as err:
            stack.anthropic.messages.count_tokens(model="nope", messages=user("x"))
        assert err.value.body["type"] == "error"

    def test_wrong_method(self, stack):
        reply = httpx.get(stack.base_url + "/v1/messages", timeout=10)
        assert reply.status_code == 405 and reply.json()["type"] == "error"


class TestTokenize:
    def test_counts_equal_usage_and_round_trip(self, stack):
        messages = [{"role": "user", "content": QUESTION}]
        chat = stack.client.chat.completions.create(model="ds-v3", messages=messages, max_tokens=1)
        for path in ("/tokenize", "/v1/tokenize"):
            got = httpx.post(
                stack.base_url + path, json={"model": "ds-v3", "messages": messages}, timeout=10
            ).json()
            assert got["count"] == chat.usage.prompt_tokens == len(got["tokens"])
        text = httpx.post(
            stack.base_url + "/detokenize", json={"model": "ds-v3", "tokens": got["tokens"]}
        ).json()["prompt"]
        again = httpx.post(
            stack.base_url + "/tokenize",
            json={"model": "ds-v3", "prompt": text, "add_special_tokens": False},
        ).json()
        assert again["tokens"] == got["tokens"]
        completion = stack.client.completions.create(model="ds-v3", prompt=QUESTION, max_tokens=1)
        counted = httpx.post(
            stack.base_url + "/v1/tokenize", json={"model": "ds-v3", "prompt": QUESTION}
        ).json()
        assert counted["count"] == completion.usage.prompt_tokens
