"""POST /v1/responses through `serve` over fake router/dispatcher clients: the chat stages
with the Responses parse and sinks (the response object, the SSE event sequence, tool calls,
reasoning items, incomplete answers, failures, migration)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
import pytest

from switchyard.common import errors
from switchyard.preprocessor.parsers import parsers_for
from switchyard.preprocessor.parsers.deepseek import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
)
from switchyard.preprocessor.stages.context import RESPONSES
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
from switchyard.protos.messages import CONSTRAINT_JSON_SCHEMA

pytestmark = pytest.mark.timeout(30)

CALL = (
    f'{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_weather\n```json\n{{"city": "Paris"}}\n```'
    f"{CALL_END}{CALLS_END}"
)
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def body(**fields: Any) -> bytes:
    out: dict[str, Any] = {"model": MODEL, "input": "hi", "max_output_tokens": 64}
    out.update(fields)
    return orjson.dumps(out)


def events(http: FakeHttp) -> list[tuple[str, dict[str, Any]]]:
    """(event line, data) of every SSE frame."""
    out = []
    for frame in http.body.split(b"\n\n"):
        if not frame:
            continue
        head, data = frame.split(b"\n", 1)
        assert head.startswith(b"event: ") and data.startswith(b"data: "), frame
        payload = orjson.loads(data[6:])
        assert payload["type"] == head[7:].decode()
        out.append((payload["type"], payload))
    return out


def replying(bundle, text: str, reason: str = "stop", one_by_one: bool = True):
    ids = bundle.encode(text)

    def script(req):
        if one_by_one:
            return [tokens(req.request_id, i) for i in ids] + [done(req.request_id, reason)]
        return [tokens(req.request_id, *ids), done(req.request_id, reason)]

    return script


async def run(d, raw: bytes) -> tuple[int, FakeHttp]:
    http = FakeHttp()
    return await serve(d, RESPONSES, raw, http), http


def r1(d):
    """The same deps with DeepSeek-R1's reasoning parser (output starts in reasoning)."""
    return dataclasses.replace(
        d,
        parsers=lambda model, b: parsers_for(
            b.model_config, b.chat_template.source, None, "deepseek_r1"
        ),
    )


class TestResponseObject:
    async def test_text_answer(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(replying(bundle, "Hello there")))
        status, http = await run(d, body(instructions="Be brief.", metadata={"k": "v"}))
        assert status == 200
        got = http.json()
        assert got["object"] == "response" and got["id"].startswith("resp_")
        assert got["status"] == "completed" and got["incomplete_details"] is None
        (message,) = got["output"]
        assert message["type"] == "message" and message["role"] == "assistant"
        assert message["id"].startswith("msg_") and message["status"] == "completed"
        assert message["content"] == [
            {"type": "output_text", "text": "Hello there", "annotations": [], "logprobs": []}
        ]
        assert got["instructions"] == "Be brief." and got["metadata"] == {"k": "v"}
        assert got["store"] is False and got["max_output_tokens"] == 64
        usage = got["usage"]
        assert usage["output_tokens"] == len(bundle.encode("Hello there"))
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        assert usage["input_tokens_details"] == {"cached_tokens": 0}

    async def test_instructions_come_first_in_the_prompt(self, bundle):
        dispatcher = FakeDispatcher(replying(bundle, "ok"))
        d = deps(bundle, FakeRouter([1]), dispatcher)
        await run(d, body(instructions="SYSTEM-RULES", input="QUESTION"))
        prompt = bundle.decode(dispatcher.requests[0].token_ids)
        assert prompt.index("SYSTEM-RULES") < prompt.index("QUESTION")

    async def test_max_output_tokens_cut_is_incomplete(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(replying(bundle, "a b c", "length")))
        _, http = await run(d, body(max_output_tokens=3))
        got = http.json()
        assert got["status"] == "incomplete"
        assert got["incomplete_details"] == {"reason": "max_output_tokens"}
        assert got["output"][-1]["status"] == "incomplete"
        assert d.dispatcher.requests[0].sampling.max_tokens == 3

    async def test_function_call_item(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(replying(bundle, "Let me check." + CALL)))
        _, http = await run(d, body(tools=TOOLS))
        message, call = http.json()["output"]
        assert message["content"][0]["text"] == "Let me check."
        assert call["type"] == "function_call" and call["name"] == "get_weather"
        assert orjson.loads(call["arguments"]) == {"city": "Paris"}
        assert call["call_id"] and call["id"].startswith("fc_")

    async def test_only_a_call_has_no_message(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(replying(bundle, CALL)))
        _, http = await run(d, body(tools=TOOLS))
        assert [item["type"] for item in http.json()["output"]] == ["function_call"]

    async def test_reasoning_item(self, bundle):
        script = replying(bundle, "Counting first.</think>Seven.")
        d = r1(deps(bundle, FakeRouter([1]), FakeDispatcher(script)))
        _, http = await run(d, body())
        got = http.json()
        reasoning, message = got["output"]
        assert reasoning["type"] == "reasoning" and reasoning["summary"] == []
        assert reasoning["content"] == [{"type": "reasoning_text", "text": "Counting first."}]
        assert message["content"][0]["text"] == "Seven."
        assert got["usage"]["output_tokens_details"]["reasoning_tokens"] > 0

    async def test_text_format_json_schema_reaches_the_engine(self, bundle):
        dispatcher = FakeDispatcher(replying(bundle, '{"a": 1}'))
        d = deps(bundle, FakeRouter([1]), dispatcher)
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
        _, http = await run(d, body(text={"format": fmt}))
        constraint = dispatcher.requests[0].sampling.constraint
        assert constraint.kind == CONSTRAINT_JSON_SCHEMA
        assert orjson.loads(constraint.value) == schema
        assert http.json()["text"] == {"format": fmt}

    async def test_required_tool_choice_constrains_the_engine(self, bundle):
        dispatcher = FakeDispatcher(replying(bundle, "x"))
        d = deps(bundle, FakeRouter([1]), dispatcher)
        await run(d, body(tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"}))
        assert dispatcher.requests[0].sampling.constraint.kind == CONSTRAINT_JSON_SCHEMA


class TestStream:
    async def test_event_sequence(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(replying(bundle, "Hello there")))
        status, http = await run(d, body(stream=True))
        assert status == 200 and http.ended
        got = events(http)
        kinds = [kind for kind, _ in got]
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert kinds[-4:] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert set(kinds[4:-4]) == {"response.output_text.delta"}
        assert [data["sequence_number"] for _, data in got] == list(range(len(got)))
        text = "".join(data["delta"] for kind, data in got if kind.endswith("text.delta"))
        assert text == "Hello there"
        final = got[-1][1]["response"]
        assert final["status"] == "completed" and final["usage"]["output_tokens"] > 0
        assert final["output"][0]["content"][0]["text"] == "Hello there"
        assert got[0][1]["response"]["status"] == "in_progress"
        assert got[0][1]["response"]["id"] == final["id"]

    async def test_reasoning_then_message_then_call(self, bundle):
        script = replying(bundle, "Look it up.</think>Let me check." + CALL)
        d = r1(deps(bundle, FakeRouter([1]), FakeDispatcher(script)))
        _, http = await run(d, body(stream=True, tools=TOOLS))
        got = events(http)
        added = [data["item"]["type"] for kind, data in got if kind.endswith("item.added")]
        assert added == ["reasoning", "message", "function_call"]
        reasoning = "".join(d["delta"] for k, d in got if k == "response.reasoning_text.delta")
        assert reasoning == "Look it up."
        (rdone,) = [d for k, d in got if k == "response.reasoning_text.done"]
        assert rdone["text"] == "Look it up."
        args = "".join(d["delta"] for k, d in got if k.endswith("arguments.delta"))
        (adone,) = [d for k, d in got if k.endswith("arguments.done")]
        assert orjson.loads(args) == {"city": "Paris"} and adone["arguments"] == args
        final = got[-1][1]["response"]
        assert [item["type"] for item in final["output"]] == [
            "reasoning",
            "message",
            "function_call",
        ]
        indexes = [d["output_index"] for k, d in got if k.endswith("item.added")]
        assert indexes == [0, 1, 2]

    async def test_incomplete(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(replying(bundle, "a b", "length")))
        _, http = await run(d, body(stream=True, max_output_tokens=2))
        kind, data = events(http)[-1]
        assert kind == "response.incomplete"
        assert data["response"]["incomplete_details"] == {"reason": "max_output_tokens"}

    async def test_the_closing_events_go_with_the_end_of_the_stream(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(replying(bundle, "Hello there")))
        _, http = await run(d, body(stream=True))
        assert b"event: response.completed" in http.last
        assert not any(b"response.completed" in write for write in http.writes[:-1])

    async def test_batched_replies_are_one_delta(self, bundle):
        d = deps(
            bundle,
            FakeRouter([1]),
            FakeDispatcher(replying(bundle, "one two three", one_by_one=False)),
        )
        _, http = await run(d, body(stream=True))
        deltas = [data for kind, data in events(http) if kind.endswith("text.delta")]
        assert [data["delta"] for data in deltas] == ["one two three"]

    async def test_migration_continues_the_same_items(self, bundle):
        first = bundle.encode("Hello")
        rest = bundle.encode(" there")

        def script(req):
            if req.instance_id == 1:
                return [
                    tokens(req.request_id, *first),
                    failed(req.request_id, 1, errors.CANNOT_CONNECT),
                ]
            return [tokens(req.request_id, *rest), done(req.request_id, "stop")]

        d = deps(bundle, FakeRouter([1, 2]), FakeDispatcher(script))
        _, http = await run(d, body(stream=True))
        got = events(http)
        assert sum(kind.endswith("item.added") for kind, _ in got) == 1
        text = "".join(data["delta"] for kind, data in got if kind.endswith("text.delta"))
        assert text == "Hello there" and got[-1][0] == "response.completed"


class TestFailures:
    async def test_before_any_output_is_an_http_status(self, bundle):
        d = deps(
            bundle,
            FakeRouter([1]),
            FakeDispatcher(lambda r: [failed(r.request_id, 1, errors.BAD_REQUEST)]),
        )
        status, http = await run(d, body(stream=True))
        assert status == 400 and http.json()["error"]["code"] == "engine_rejected"

    async def test_mid_stream_is_response_failed(self, bundle):
        dispatcher = FakeDispatcher(lambda r: [tokens(r.request_id, *bundle.encode("Hi"))])
        d = deps(bundle, FakeRouter([1]), dispatcher)
        http = FakeHttp()
        serving = asyncio.create_task(serve(d, RESPONSES, body(stream=True), http))
        while not http.writes:
            await asyncio.sleep(0.01)
        rid = dispatcher.requests[0].request_id
        dispatcher.streams[0].queue.put_nowait(failed(rid, 1, errors.ENGINE_ERROR))
        assert await serving == 200
        kind, data = events(http)[-1]
        assert kind == "response.failed"
        response = data["response"]
        assert response["status"] == "failed" and response["error"]["code"] == "server_error"
        assert "engine failed" in response["error"]["message"]

    async def test_no_worker(self, bundle):
        d = deps(bundle, FakeRouter([]), FakeDispatcher(lambda r: []))
        status, _ = await run(d, body(stream=True))
        assert status == 503

    async def test_errors_of_the_shared_stages_name_responses_fields(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(lambda r: []), context_length=64)
        status, http = await run(d, body(input="word " * 200, max_output_tokens=8))
        error = http.json()["error"]
        assert status == 400 and error["code"] == "context_length_exceeded"
        assert error["param"] == "input" and "messages" not in error["message"]
        status, http = await run(d, body(reasoning={"effort": "high"}))
        error = http.json()["error"]
        assert status == 400 and error["param"] == "reasoning.effort"
        assert "'reasoning.effort'" in error["message"]

    async def test_client_leaving_aborts_the_engine_request(self, bundle):
        dispatcher = FakeDispatcher(lambda r: [tokens(r.request_id, 7)])
        d = deps(bundle, FakeRouter([1]), dispatcher)
        serving = asyncio.create_task(run(d, body(stream=True)))
        while not dispatcher.streams:
            await asyncio.sleep(0.01)
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        assert dispatcher.streams[0].cancelled
