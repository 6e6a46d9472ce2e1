"""Messages API bodies -> the chat request they amount to (anthropic_requests): every field
carried over or refused with a 400 naming it; errors in Anthropic's shape."""

from __future__ import annotations

import orjson
import pytest

from switchyard.preprocessor.anthropic_requests import (
    AnthropicError,
    anthropic_error,
    parse_count_tokens,
    parse_messages,
)
from switchyard.preprocessor.errors import (
    AuthenticationError,
    DeadlineExceededError,
    InvalidRequestError,
    ModelNotFoundError,
    RateLimitError,
    RequestError,
    ServiceUnavailableError,
)

TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def body(**fields) -> bytes:
    base = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    base.update(fields)
    return orjson.dumps(base)


def refused(**fields) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as err:
        parse_messages(body(**fields))
    return err.value


class TestPrompt:
    def test_plain(self):
        req = parse_messages(body(system="Be brief."))
        assert req.messages == (
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        )
        assert req.sampling.max_tokens == 16 and req.add_generation_prompt
        assert not req.stream and req.tools == () and req.tool_choice is None

    def test_system_blocks_and_cache_control(self):
        system = [
            {"type": "text", "text": "One.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Two."},
        ]
        req = parse_messages(body(system=system, cache_control={"type": "ephemeral"}))
        assert req.messages[0] == {"role": "system", "content": "One.\nTwo."}

    def test_a_tool_loop(self):
        messages = [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Look it up.", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather",
                     "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                     "content": [{"type": "text", "text": "timeout"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ]  # fmt: skip
        req = parse_messages(body(messages=messages, tools=[TOOL]))
        assert req.messages == (
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "reasoning_content": "Look it up.",
                "tool_calls": [
                    {
                        "type": "function",
                        "id": "t1",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "t1", "name": "get_weather"},
            {"role": "tool", "content": "Error: timeout", "tool_call_id": "t1",
             "name": "get_weather"},
            {"role": "user", "content": "And tomorrow?"},
        )  # fmt: skip
        assert req.tools == (
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": TOOL["input_schema"],
                    "description": "The weather in a city",
                },
            },
        )

    def test_a_last_assistant_message_is_a_prefill(self):
        messages = [
            {"role": "user", "content": "Pick one: (A) or (B)"},
            {"role": "assistant", "content": "The answer is ("},
        ]
        req = parse_messages(body(messages=messages))
        assert req.continue_final_message and not req.add_generation_prompt

    def test_sampling_and_session(self):
        req = parse_messages(
            body(
                temperature=0.2, top_p=0.9, top_k=5, stop_sequences=["END", "STOP"],
                metadata={"user_id": "u-1"}, stream=True, service_tier="standard_only",
            )
        )  # fmt: skip
        s = req.sampling
        assert (s.temperature, s.top_p, s.top_k, s.stop) == (0.2, 0.9, 5, ("END", "STOP"))
        assert req.user == "u-1" and req.stream

    def test_output_config(self):
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        req = parse_messages(
            body(
                output_config={
                    "effort": "high",
                    "format": {"type": "json_schema", "schema": schema},
                }
            )
        )
        assert req.template_kwargs == {"reasoning_effort": "high"}
        assert req.sampling.constraint is not None
        assert orjson.loads(req.sampling.constraint.value) == schema
        assert req.sampling.constraint_param == "output_config.format"

    @pytest.mark.parametrize(
        "choice, expected, parallel",
        [
            ({"type": "auto"}, "auto", True),
            ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
            ({"type": "none"}, "none", True),
            (
                {"type": "tool", "name": "get_weather"},
                {"type": "function", "function": {"name": "get_weather"}},
                True,
            ),
        ],
    )
    def test_tool_choice(self, choice, expected, parallel):
        req = parse_messages(body(tools=[TOOL], tool_choice=choice))
        assert req.tool_choice == expected and req.parallel_tool_calls is parallel

    @pytest.mark.parametrize(
        "thinking, kind, omitted",
        [
            ({"type": "enabled", "budget_tokens": 1024}, "enabled", False),
            ({"type": "adaptive", "display": "omitted"}, "adaptive", True),
            ({"type": "disabled"}, "disabled", False),
        ],
    )
    def test_thinking(self, thinking, kind, omitted):
        req = parse_messages(body(max_tokens=2048, thinking=thinking))
        assert req.thinking == kind and req.thinking_omitted is omitted

    def test_count_tokens_has_no_max_tokens(self):
        raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        req = parse_count_tokens(raw)
        assert req.sampling.max_tokens is None and req.messages[-1]["content"] == "hi"
        with pytest.raises(InvalidRequestError) as err:
            parse_count_tokens(raw[:-1] + b',"max_tokens":5}')
        assert err.value.param == "max_tokens"


class TestRefused:
    @pytest.mark.parametrize(
        "fields, param",
        [
            ({"max_tokens": None}, "max_tokens"),
            ({"messages": []}, "messages"),
            ({"temperature": 1.5}, "temperature"),
            ({"top_k": 0}, "top_k"),
            ({"stop_sequences": ["ok", ""]}, "stop_sequences[1]"),
            ({"unknown": 1}, "unknown"),
            ({"container": "c-1"}, "container"),
            ({"inference_geo": "us"}, "inference_geo"),
            ({"speed": "fast"}, "speed"),
            ({"mcp_servers": []}, "mcp_servers"),
            ({"workspace_id": "w"}, "workspace_id"),
            ({"metadata": {"user_id": "u", "other": 1}}, "metadata.other"),
            ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "thinking.budget_tokens"),
            ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "thinking.budget_tokens"),
            ({"thinking": {"type": "adaptive", "display": "summarized"}}, "thinking.display"),
            ({"tool_choice": {"type": "any"}}, "tool_choice"),
            ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
            ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
            ({"tools": [{**TOOL, "defer_loading": True}]}, "tools[0].defer_loading"),
            ({"tools": [{**TOOL, "input_examples": [{"city": "x"}]}]}, "tools[0].input_examples"),
            ({"tools": [{"name": "x"}]}, "tools[0].input_schema"),
        ],
    )
    def test_a_400_naming_the_field(self, fields, param):
        raw = orjson.loads(body())
        raw.update(fields)
        if fields.get("max_tokens", 0) is None:
            del raw["max_tokens"]
        with pytest.raises(InvalidRequestError) as err:
            parse_messages(orjson.dumps(raw))
        assert err.value.param == param, err.value

    @pytest.mark.parametrize(
        "block, param",
        [  # fmt: off
            ({"type": "image", "source": {"type": "url", "url": "x"}},
             "messages[0].content[0].type"),
            ({"type": "document", "source": {}}, "messages[0].content[0].type"),
            ({"type": "redacted_thinking", "data": "x"}, "messages[0].content[0].type"),
            ({"type": "server_tool_use", "id": "x"}, "messages[0].content[0].type"),
            ({"type": "text", "text": "x", "citations": [{"x": 1}]},
             "messages[0].content[0].citations"),
            ({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]},
             "messages[0].content[0].content[0].type"),
            ({"type": "thinking", "thinking": "x"}, "messages[0].content[0].type"),
        ],
    )  # fmt: skip
    def test_blocks(self, block, param):
        assert refused(messages=[{"role": "user", "content": [block]}]).param == param

    def test_a_prefill_cannot_end_in_a_tool_use(self):
        use = {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}
        messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": [use]}]
        assert refused(messages=messages, tools=[TOOL]).param == "messages[1].content"


class TestToolPairing:
    """As Anthropic's API (and smg): a tool_use is answered in the next message, a
    tool_result answers a tool_use of the message before it; else a 400 naming where."""

    USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}

    def result(self, use_id: str = "toolu_1") -> dict:
        return {"type": "tool_result", "tool_use_id": use_id, "content": "sunny"}

    def history(self, answer) -> list[dict]:
        return [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}, self.USE]},
            {"role": "user", "content": answer},
        ]

    def test_answered(self):
        req = parse_messages(body(messages=self.history([self.result()]), tools=[TOOL]))
        assert [m["role"] for m in req.messages] == ["user", "assistant", "tool"]

    @pytest.mark.parametrize(
        "answer", ["go on", [{"type": "text", "text": "go on"}]], ids=["string", "blocks"]
    )
    def test_a_tool_use_left_unanswered(self, answer):
        err = refused(messages=self.history(answer), tools=[TOOL])
        assert err.param == "messages[2].content"
        assert "toolu_1" in err.message and "tool_result" in err.message

    def test_a_result_of_no_tool_use(self):
        answer = [self.result(), self.result("toolu_9")]
        err = refused(messages=self.history(answer), tools=[TOOL])
        assert err.param == "messages[2].content[1].tool_use_id" and "toolu_9" in err.message

    def test_a_result_without_a_call_before_it(self):
        err = refused(messages=[{"role": "user", "content": [self.result()]}])
        assert err.param == "messages[0].content[0].tool_use_id"


class TestErrors:
    @pytest.mark.parametrize(
        "err, status, kind",
        [
            (InvalidRequestError("bad", param="top_k"), 400, "invalid_request_error"),
            (AuthenticationError("no key"), 401, "authentication_error"),
            (ModelNotFoundError("x"), 404, "not_found_error"),
            (RequestError(413, "big", "invalid_request_error", "request_too_large"), 413,
             "request_too_large"),
            (RateLimitError("slow down", 3), 429, "rate_limit_error"),
            (ServiceUnavailableError("no engine"), 529, "overloaded_error"),
            (DeadlineExceededError(2.0), 504, "timeout_error"),
            (RequestError(500, "boom", "server_error", "internal_error"), 500, "api_error"),
        ],
    )  # fmt: skip
    def test_shape_and_status(self, err, status, kind):
        out = anthropic_error(err)
        assert isinstance(out, AnthropicError) and out.status == status
        body = orjson.loads(out.body())
        assert body == {"type": "error", "error": {"type": kind, "message": out.message}}
        assert anthropic_error(out) is out

    def test_the_message_names_the_field(self):
        out = anthropic_error(InvalidRequestError("must be positive", param="max_tokens"))
        assert out.message == "max_tokens: must be positive"

    def test_shared_stage_fields_are_renamed(self):
        err = InvalidRequestError(
            "'reasoning_effort' is not used by this model's chat template.",
            param="reasoning_effort",
        )
        out = anthropic_error(err)
        assert out.param == "output_config.effort"
        assert "'output_config.effort'" in out.message
