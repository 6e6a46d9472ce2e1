"""What a client observes of a vLLM-protocol engine, reduced to shapes two engines can share.

`observe(target, kv_events)` asks an engine (the real one or the mock) what a gateway asks it:
GetModelInfo, GetServerInfo, GetLoads, Generate with bad inputs (status code and message),
Abort mid-stream and of an unknown id, and the KV events a request publishes (ZMQ frames and
payload). `message_shape`, `event_shapes` and `blank_numbers` keep what must agree between
engines serving different models: the fields each reply sets and their types; the status codes;
messages with their numbers blanked; the event types and each event's keys with their value
types.

The real-engine suite records a real vLLM's observation into
services/mock_engine/tests/fixtures/ (`make test-engines` with SWITCHYARD_RECORD_FIXTURES=1;
paths and times scrubbed), and the mock's tests check that the mock answers the same shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from typing import Any

import grpc
import msgspec
import zmq
import zmq.asyncio
from google.protobuf.json_format import MessageToDict
from smg_grpc_proto import vllm_engine_pb2 as pb
from smg_grpc_proto import vllm_engine_pb2_grpc as pb_grpc

# Fields whose values are the engine's own (its paths, clock, version, load): types only.
VOLATILE = re.compile(
    r"path|time|version|uptime|id$|^num_|tokens$|usage|throughput|rate|^active|_at$|port$"
)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else type(value).__name__


def message_shape(message: Any) -> dict[str, str]:
    """Each field a proto message sets (defaults included) -> its JSON type."""
    fields = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return {name: _kind(value) for name, value in sorted(fields.items())}


def scrub(message: Any) -> dict[str, Any]:
    """The message as JSON with volatile values replaced by their type (for fixtures)."""
    fields = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )

    def walk(name: str, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(k, v) for k, v in sorted(value.items())}
        if isinstance(value, list):
            return [walk(name, v) for v in value]
        if VOLATILE.search(name):
            return f"<{_kind(value)}>"
        return value

    return {k: walk(k, v) for k, v in sorted(fields.items())}


def blank_numbers(text: str) -> str:
    return re.sub(r"\d+", "N", text)


def _request(rid: str, ids: list[int], **sampling: Any) -> pb.GenerateRequest:
    params: dict[str, Any] = {
        "temperature": 0.0,
        "top_p": 1.0,
        "repetition_penalty": 1.0,
        "max_tokens": 4,
    }
    params.update(sampling)
    bias = params.pop("logit_bias", None)
    message = pb.SamplingParams(**params)
    if bias:
        for key, value in bias.items():
            message.logit_bias[key] = value
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=message,
        stream=True,
    )


def bad_requests(context: int, vocab: int) -> dict[str, pb.GenerateRequest]:
    """Generate requests a gateway can send that the engine must refuse."""
    return {
        "prompt_over_context": _request("bad-1", [1000] * (context + 8)),
        "max_tokens_over_context": _request("bad-2", [1000] * 8, max_tokens=context),
        "token_out_of_vocab": _request("bad-3", [1000, vocab + 5]),
        "empty_prompt": _request("bad-4", []),
        "logprobs_over_max": _request("bad-5", [1000] * 8, logprobs=25),
        "bad_json_schema": _request("bad-6", [1000] * 8, json_schema="{not json"),
        "logit_bias_out_of_vocab": _request("bad-7", [1000] * 8, logit_bias={vocab + 5: 1.0}),
    }


async def _status(call: Any) -> dict[str, str]:
    """The call's status code and message; OK once a first reply came (the request was
    taken: the rest is not waited for, a long one could outlast any deadline)."""
    try:
        async for _ in call:
            call.cancel()
            break
    except grpc.aio.AioRpcError as exc:
        return {"code": exc.code().name, "message": exc.details() or ""}
    return {"code": "OK", "message": ""}


async def _abort_mid_stream(stub: Any) -> dict[str, Any]:
    request = _request("abort-me", [1000 + i for i in range(16)], max_tokens=1500, ignore_eos=True)
    request.stream = True
    call = stub.Generate(request)
    got: list[Any] = []
    async for reply in call:
        got.append(reply)
        if len(got) == 2:
            await stub.Abort(pb.AbortRequest(request_ids=["abort-me"]), timeout=10)
    last = got[-1]
    kind = last.WhichOneof("response")
    return {
        "last_message": kind,
        "finish_reason": last.complete.finish_reason if kind == "complete" else None,
        "status": (await call.code()).name,
    }


async def _kv_events(stub: Any, endpoint: str, block: int, wait_s: float) -> list[list[Any]]:
    """The frames the engine publishes while serving a request: [topic, seq, payload].

    A SUB socket's subscription reaches the publisher some time after it connects (ZMQ's
    slow joiner) and nothing says when, so requests with prompts new to the engine's cache
    are sent, each followed by `wait_s` of listening, until a BlockStored has come."""
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    frames: list[list[Any]] = []
    try:
        loop = asyncio.get_running_loop()
        for attempt in range(20):
            prompt = [random.randrange(2000, 100_000) for _ in range(2 * block + 5)]
            async for _ in stub.Generate(_request(f"kv-{attempt}", prompt, max_tokens=2)):
                pass  # to its end: the engine stores the prompt's blocks
            deadline = loop.time() + wait_s
            while (left := deadline - loop.time()) > 0:
                if not await sub.poll(left * 1000):
                    break
                frames.append(await sub.recv_multipart())
            if "BlockStored" in _event_types(frames):
                break
        return frames
    finally:
        sub.close(linger=0)


def _event_types(frames: list[list[bytes]]) -> set[str]:
    return {
        str(event["type"] if isinstance(event, dict) else event[0])
        for frame in frames
        for event in msgspec.msgpack.decode(frame[-1])[1]
    }


def event_shapes(frames: list[list[bytes]]) -> dict[str, Any]:
    """Frame count, the payload's layout, and per event type its keys -> value types."""
    events: dict[str, dict[str, str]] = {}
    layouts = set()
    counts = set()
    for frame in frames:
        counts.add(len(frame))
        payload = msgspec.msgpack.decode(frame[-1])
        layouts.add(json.dumps([_kind(part) for part in payload]))
        for event in payload[1]:
            if isinstance(event, dict):
                kinds = {k: _kind(v) for k, v in sorted(event.items())}
                events[str(event["type"])] = kinds
            else:
                events[str(event[0])] = {f"[{i}]": _kind(v) for i, v in enumerate(event)}
    return {
        "frames_per_message": sorted(counts),
        "sequence_bytes": sorted({len(f[1]) for f in frames}) if frames else [],
        "payload": sorted(layouts),
        "events": dict(sorted(events.items())),
    }


async def observe(target: str, kv_events: str | None, kv_wait_s: float = 3.0) -> dict[str, Any]:
    """Everything above, as a JSON-able document (values scrubbed where volatile)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        model = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
        server = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=30)
        loads = await stub.GetLoads(pb.GetLoadsRequest(), timeout=30)
        errors = {}
        for name, request in bad_requests(model.max_context_length, model.vocab_size).items():
            errors[name] = await _status(stub.Generate(request, timeout=60))
        unknown_abort = {"code": "OK"}
        try:
            await stub.Abort(pb.AbortRequest(request_ids=["no-such-request"]), timeout=10)
        except grpc.aio.AioRpcError as exc:
            unknown_abort = {"code": exc.code().name}
        abort = await _abort_mid_stream(stub)
        kv: dict[str, Any] = {}
        if kv_events is not None:
            block = int(server.block_size) or 16
            with contextlib.suppress(asyncio.TimeoutError):
                kv = event_shapes(await _kv_events(stub, kv_events, block, kv_wait_s))
    return {
        "GetModelInfo": {"shape": message_shape(model), "value": scrub(model)},
        "GetServerInfo": {"shape": message_shape(server), "value": scrub(server)},
        "GetLoads": {"shape": message_shape(loads), "value": scrub(loads)},
        "errors": errors,
        "abort_unknown_id": unknown_abort,
        "abort_mid_stream": abort,
        "kv_events": kv,
    }
