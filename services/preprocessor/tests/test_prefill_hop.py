"""The prefill hop against a fake dispatcher: both protocols' legs, and failures."""

from __future__ import annotations

import asyncio
import json

from switchyard.common import errors
from switchyard.preprocessor.prefill_hop import PREFILL_SUFFIX, VLLM_PREFILL_PARAMS, open_hop
from switchyard.preprocessor.reply_queue import ReplyQueue
from switchyard.protos.messages import (
    GenerateFailed,
    GenerateFinished,
    GenerateRequest,
    Instance,
    SamplingParams,
    TokenDelta,
)


def inst(iid: int, protocol: str, bootstrap: int | None = None) -> Instance:
    return Instance(
        instance_id=iid,
        url=f"grpc://10.0.0.{iid}:5000",
        protocol=protocol,
        model="m",
        context_length=1024,
        block_size=16,
        bootstrap_port=bootstrap,
    )


class FakeStream:
    def __init__(self, request: GenerateRequest, queue: ReplyQueue | None) -> None:
        self.request = request
        self.queue = queue if queue is not None else ReplyQueue()
        self.cancelled = False

    async def cancel(self) -> None:
        self.cancelled = True

    def close(self) -> None:
        pass


class FakeDispatcher:
    def __init__(self, script) -> None:
        self.opened: list[FakeStream] = []
        self.script = script  # request -> list of replies to queue

    async def open(self, request: GenerateRequest, queue: ReplyQueue | None) -> FakeStream:
        stream = FakeStream(request, queue)
        self.opened.append(stream)
        for reply in self.script(request):
            stream.queue.put_nowait(reply)
        return stream


def request() -> GenerateRequest:
    return GenerateRequest(
        request_id="r", instance_id=2, token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=4)
    )


def finished(rid: str, reason: str = "length", params: str | None = None) -> GenerateFinished:
    return GenerateFinished(
        request_id=rid,
        finish_reason=reason,
        prompt_tokens=3,
        completion_tokens=1,
        kv_transfer_params_json=params,
    )


async def drain(hop, limit: float = 2.0) -> list:
    """The replies the hop put in the request's queue, up to the first final one (a decode
    leg's failure as the generation sees it: through `blame`)."""
    out = []
    while True:
        async with asyncio.timeout(limit):
            reply = await hop.queue.get()
        if type(reply) is GenerateFailed:
            reply = hop.blame(reply)
        out.append(reply)
        if type(reply) is not TokenDelta:
            return out


def hop_queue() -> ReplyQueue:
    return ReplyQueue()


async def test_sglang_opens_both_legs_with_the_same_params():
    def script(req):
        if req.request_id.endswith(PREFILL_SUFFIX):
            return [TokenDelta(req.request_id, [7]), finished(req.request_id)]
        return [TokenDelta(req.request_id, [7, 8]), finished(req.request_id, "stop")]

    fake = FakeDispatcher(script)
    hop = await open_hop(
        fake.open, request(), inst(1, "sglang", 9001), inst(2, "sglang"), 2.0, hop_queue()
    )
    out = await drain(hop)
    assert [type(r) for r in out] == [TokenDelta, GenerateFinished]
    prefill, decode = sorted(fake.opened, key=lambda s: s.request.instance_id)
    assert prefill.request.instance_id == 1 and decode.request.instance_id == 2
    assert prefill.request.disagg == decode.request.disagg
    params = decode.request.disagg
    assert (params.bootstrap_host, params.bootstrap_port) == ("10.0.0.1", 9001)
    assert 0 < params.bootstrap_room < 2**31


async def test_sglang_prefill_failure_cancels_decode_and_blames_prefill():
    def script(req):
        if req.request_id.endswith(PREFILL_SUFFIX):
            return [
                GenerateFailed(
                    request_id=req.request_id,
                    instance_id=1,
                    kind=errors.CANNOT_CONNECT,
                    message="refused",
                )
            ]
        return []  # the decode leg waits for KV forever

    fake = FakeDispatcher(script)
    hop = await open_hop(
        fake.open, request(), inst(1, "sglang", 9001), inst(2, "sglang"), 2.0, hop_queue()
    )
    (failure,) = await drain(hop)
    assert type(failure) is GenerateFailed
    assert (failure.instance_id, failure.kind) == (1, errors.CANNOT_CONNECT)
    decode = next(s for s in fake.opened if s.request.instance_id == 2)
    assert decode.cancelled


async def test_sglang_silent_prefill_is_bounded_by_the_idle_timeout():
    fake = FakeDispatcher(lambda req: [])
    hop = await open_hop(
        fake.open, request(), inst(1, "sglang", 9001), inst(2, "sglang"), 0.2, hop_queue()
    )
    (failure,) = await drain(hop)
    assert failure.kind in errors.MIGRATABLE and failure.instance_id == 1


async def test_vllm_prefill_then_decode_with_its_params_unchanged():
    handover = json.dumps({"do_remote_prefill": True, "remote_host": "h", "remote_port": 1})

    def script(req):
        if req.request_id.endswith(PREFILL_SUFFIX):
            return [TokenDelta(req.request_id, [7]), finished(req.request_id, params=handover)]
        return [TokenDelta(req.request_id, [7, 8]), finished(req.request_id, "stop")]

    fake = FakeDispatcher(script)
    hop = await open_hop(fake.open, request(), inst(1, "vllm"), inst(2, "vllm"), 2.0, hop_queue())
    out = await drain(hop)
    assert [r.token_ids for r in out[:-1]] == [[7, 8]]
    prefill, decode = fake.opened
    assert prefill.request.stream is False and prefill.request.sampling.max_tokens == 1
    assert prefill.request.kv_transfer_params_json == VLLM_PREFILL_PARAMS
    assert decode.request.kv_transfer_params_json == handover and decode.request.stream


async def test_vllm_decode_transfer_failure_blames_the_prefill():
    def script(req):
        if req.request_id.endswith(PREFILL_SUFFIX):
            return [finished(req.request_id, params="{}")]
        return [
            GenerateFailed(
                request_id=req.request_id,
                instance_id=2,
                kind=errors.BAD_REQUEST,
                message="KV transfer failed for x",
            )
        ]

    fake = FakeDispatcher(script)
    hop = await open_hop(fake.open, request(), inst(1, "vllm"), inst(2, "vllm"), 2.0, hop_queue())
    (failure,) = await drain(hop)
    assert failure.instance_id == 1 and failure.kind in errors.MIGRATABLE


async def test_vllm_prefill_ending_on_eos_is_the_whole_answer():
    def script(req):
        return [TokenDelta(req.request_id, [0]), finished(req.request_id, "stop")]

    fake = FakeDispatcher(script)
    hop = await open_hop(fake.open, request(), inst(1, "vllm"), inst(2, "vllm"), 2.0, hop_queue())
    out = await drain(hop)
    assert [type(r) for r in out] == [TokenDelta, GenerateFinished]
    assert out[0].request_id == "r" and len(fake.opened) == 1


class TestNoSilentDeath:
    """Issue 14: an exception nobody foresaw inside a hop task killed it without a reply,
    and the request waited for the idle timeout."""

    async def test_a_bug_in_a_hop_task_becomes_one_engine_error_reply(self, caplog):
        class BrokenQueue:
            async def get(self):
                raise RuntimeError("bug")

        class Dispatcher(FakeDispatcher):
            async def open(self, request, queue):
                stream = await super().open(request, queue)
                if request.request_id.endswith(PREFILL_SUFFIX):
                    stream.queue = BrokenQueue()  # the prefill leg's reader trips
                return stream

        for protocol, bootstrap in (("sglang", 8998), ("vllm", None)):
            counted: list[str] = []
            queue = hop_queue()
            hop = await open_hop(
                Dispatcher(lambda req: []).open,
                request(),
                inst(1, protocol, bootstrap),
                inst(2, protocol),
                30.0,
                queue,
                counted.append,
            )
            async with asyncio.timeout(10):  # far below the 30 s idle timeout
                reply = await queue.get()
            hop.close()
            assert isinstance(reply, GenerateFailed), protocol
            assert reply.kind == errors.ENGINE_ERROR and "RuntimeError: bug" in reply.message
            assert counted == ["prefill_hop"], protocol
        assert "prefill hop failed unexpectedly request_id=r" in caplog.text
