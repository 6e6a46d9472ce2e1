"""/v1/messages through `serve` over fake router/dispatcher clients: the message object and
its SSE events (text, thinking, tool_use), stop reasons, usage, count_tokens against what is
billed, the thinking stage, and errors in Anthropic's shape before and inside a stream."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
import pytest

from switchyard.common import errors
from switchyard.preprocessor.local_endpoints import count_tokens
from switchyard.preprocessor.parsers import parsers_for
from switchyard.preprocessor.parsers.deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, SEP
from switchyard.preprocessor.stages.context import COUNT_TOKENS, MESSAGES
from switchyard.preprocessor.stages.endpoints import new_request
from switchyard.preprocessor.stages.messages import signature
from switchyard.preprocessor.stages.tests.fakes import (
    MODEL,
    FakeDispatcher,
    FakeHttp,
    FakeRouter,
    deps,
    done,
    failed,
    serve,
    tokens,
)

pytestmark = pytest.mark.timeout(30)

TOOL = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
ARGS = '{"city": "Paris"}'
CALL = f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_weather\n```json\n{ARGS}\n```{CALL_END}"


def body(**fields: Any) -> bytes:
    base = {"model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
    base.update(fields)
    return orjson.dumps(base)


def answering(bundle, text: str, reason: str = "stop", cached: int = 0, reasoning: bool = False):
    """Deps whose engine answers `text` (its real token ids, one per delta)."""
    ids = bundle.encode(text)

    def script(req):
        return [tokens(req.request_id, i) for i in ids] + [done(req.request_id, reason, cached)]

    d = deps(bundle, FakeRouter([1]), FakeDispatcher(script))
    if reasoning:
        choice = parsers_for({"model_type": "deepseek_v3"}, None, "deepseek_v3", "deepseek_r1")
        d = dataclasses.replace(d, parsers=lambda model, b: choice)
    return d


async def run(d, raw: bytes) -> tuple[int, FakeHttp]:
    http = FakeHttp()
    return await serve(d, MESSAGES, raw, http), http


def events(http: FakeHttp) -> list[tuple[str, dict]]:
    out = []
    for frame in http.body.split(b"\n\n"):
        if frame:
            name, data = frame.split(b"\n", 1)
            assert name.startswith(b"event: ") and data.startswith(b"data: ")
            payload = orjson.loads(data[6:])
            assert payload["type"] == name[7:].decode()
            out.append((payload["type"], payload))
    return out


class TestMessage:
    async def test_text(self, bundle):
        status, http = await run(answering(bundle, "Hello there", cached=3), body())
        assert status == 200
        got = http.json()
        assert got["id"].startswith("msg_") and got["type"] == "message"
        assert got["role"] == "assistant" and got["model"] == MODEL
        assert got["content"] == [{"type": "text", "text": "Hello there"}]
        assert (got["stop_reason"], got["stop_sequence"]) == ("end_turn", None)
        usage = got["usage"]
        prompt = len(bundle.encode("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>"))
        assert usage == {
            "input_tokens": prompt - 3,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 3,
            "output_tokens": len(bundle.encode("Hello there")),
        }

    async def test_max_tokens(self, bundle):
        _, http = await run(answering(bundle, "Hello", reason="length"), body())
        assert http.json()["stop_reason"] == "max_tokens"

    async def test_stop_sequence(self, bundle):
        _, http = await run(
            answering(bundle, "one two STOP three"), body(stop_sequences=["NEVER", "STOP"])
        )
        got = http.json()
        assert got["content"] == [{"type": "text", "text": "one two "}]
        assert (got["stop_reason"], got["stop_sequence"]) == ("stop_sequence", "STOP")

    async def test_tool_use(self, bundle):
        _, http = await run(answering(bundle, "Let me check." + CALL), body(tools=[TOOL]))
        got = http.json()
        text, use = got["content"]
        assert text == {"type": "text", "text": "Let me check."}
        assert use["type"] == "tool_use" and use["name"] == "get_weather"
        assert use["input"] == {"city": "Paris"} and use["id"]
        assert got["stop_reason"] == "tool_use"

    async def test_thinking(self, bundle):
        d = answering(bundle, "Count first.</think>Seven.", reasoning=True)
        _, http = await run(d, body())
        thinking, text = http.json()["content"]
        assert thinking == {
            "type": "thinking",
            "thinking": "Count first.",
            "signature": signature("Count first."),
        }
        assert text == {"type": "text", "text": "Seven."}

    async def test_thinking_omitted(self, bundle):
        d = answering(bundle, "Count first.</think>Seven.", reasoning=True)
        thinking = {"type": "adaptive", "display": "omitted"}
        _, http = await run(d, body(thinking=thinking))
        assert http.json()["content"][0]["thinking"] == ""


class TestStream:
    async def test_text_events(self, bundle):
        status, http = await run(answering(bundle, "Hello there"), body(stream=True))
        assert status == 200
        got = events(http)
        kinds = [k for k, _ in got]
        assert kinds[:3] == ["message_start", "ping", "content_block_start"]
        assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        start = got[0][1]["message"]
        assert start["content"] == [] and start["stop_reason"] is None
        assert got[2][1] == {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        text = "".join(e["delta"]["text"] for k, e in got if k == "content_block_delta")
        assert text == "Hello there"
        delta = got[-2][1]
        assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
        assert delta["usage"]["output_tokens"] == len(bundle.encode("Hello there"))

    async def test_thinking_then_tool_use(self, bundle):
        d = answering(bundle, "Look it up.</think>" + CALL, reasoning=True)
        _, http = await run(d, body(stream=True, tools=[TOOL]))
        got = events(http)
        starts = [e["content_block"] for k, e in got if k == "content_block_start"]
        assert [s["type"] for s in starts] == ["thinking", "tool_use"]
        assert starts[1]["name"] == "get_weather" and starts[1]["input"] == {}
        deltas = [e for k, e in got if k == "content_block_delta"]
        thinking = "".join(e["delta"].get("thinking", "") for e in deltas if e["index"] == 0)
        assert thinking == "Look it up."
        assert deltas[[e["index"] for e in deltas].index(1) - 1]["delta"] == {
            "type": "signature_delta",
            "signature": signature("Look it up."),
        }
        partial = "".join(e["delta"]["partial_json"] for e in deltas if e["index"] == 1)
        assert orjson.loads(partial) == {"city": "Paris"}
        stops = [e["index"] for k, e in got if k == "content_block_stop"]
        assert stops == [0, 1]
        assert got[-2][1]["delta"]["stop_reason"] == "tool_use"

    async def test_an_error_inside_the_stream(self, bundle):
        dispatcher = FakeDispatcher(lambda r: [tokens(r.request_id, *bundle.encode("Hi"))])
        d = deps(bundle, FakeRouter([1]), dispatcher)
        http = FakeHttp()
        serving = asyncio.create_task(serve(d, MESSAGES, body(stream=True), http))
        while not http.writes:
            await asyncio.sleep(0.01)
        rid = dispatcher.requests[0].request_id
        dispatcher.streams[0].queue.put_nowait(failed(rid, 1, errors.ENGINE_ERROR))
        assert await serving == 200
        got = events(http)
        assert got[0][0] == "message_start"
        kind, error = got[-1]
        assert kind == "error" and error["error"]["type"] == "api_error"
        assert set(error) == {"type", "error"} and "engine failed" in error["error"]["message"]


class TestErrorsBeforeTheAnswer:
    async def test_a_400_in_anthropic_shape(self, bundle):
        status, http = await run(answering(bundle, "x"), body(top_k=0))
        assert status == 400
        got = http.json()
        assert got["type"] == "error" and got["error"]["type"] == "invalid_request_error"
        assert "'top_k'" in got["error"]["message"]

    async def test_no_engine_is_529(self, bundle):
        d = deps(bundle, FakeRouter([]), FakeDispatcher(lambda r: None))
        status, http = await run(d, body(stream=True))
        assert status == 529 and http.json()["error"]["type"] == "overloaded_error"

    async def test_thinking_on_a_model_that_cannot(self, bundle):
        d = answering(bundle, "x")  # the DeepSeek-V3 template: no reasoning parser
        thinking = {"type": "enabled", "budget_tokens": 1024}
        status, http = await run(d, body(max_tokens=2048, thinking=thinking))
        assert status == 400 and "thinking" in http.json()["error"]["message"]

    async def test_a_prompt_over_the_context(self, bundle):
        status, http = await run(answering(bundle, "x"), body(max_tokens=4096))
        assert status == 400 and "context length" in http.json()["error"]["message"]


class TestCountTokens:
    @pytest.mark.parametrize(
        "fields",
        [
            {},
            {"system": "Be brief.", "tools": [TOOL]},
            {"tools": [TOOL], "tool_choice": {"type": "any"}},
        ],
    )
    async def test_what_messages_bills(self, bundle, fields):
        d = answering(bundle, "Hello", cached=2)
        _, http = await run(d, body(**fields))
        usage = http.json()["usage"]
        raw = orjson.loads(body(**fields))
        del raw["max_tokens"]
        ctx = new_request(d, COUNT_TOKENS, FakeHttp(), request_id="msg_x")
        counted = orjson.loads(await count_tokens(ctx, orjson.dumps(raw)))
        assert counted == {"input_tokens": usage["input_tokens"] + usage["cache_read_input_tokens"]}
