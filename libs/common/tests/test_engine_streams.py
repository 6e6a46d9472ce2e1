"""The engine adapters against minimal in-process servers that misbehave on purpose."""

import asyncio
import contextlib
import socket

import grpc
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as spb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sgrpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vgrpc

from switchyard.common import errors
from switchyard.common.engines.connect import client_for
from switchyard.common.errors import EngineError
from switchyard.protos.messages import (
    GenerateFinished,
    GenerateRequest,
    SamplingParams,
    TokenDelta,
)

# Every Generate stream here runs over both transports (conftest.both_transports).
pytestmark = pytest.mark.usefixtures("both_transports")

REQ = GenerateRequest(
    request_id="r", instance_id=1, token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=8)
)


class CutSglang(sgrpc.SglangSchedulerServicer):
    def __init__(self, code=None):
        self.code = code

    async def Generate(self, request, context):
        yield spb.GenerateResponse(
            request_id=request.request_id, chunk=spb.GenerateStreamChunk(token_ids=[5])
        )
        if self.code is not None:
            await context.abort(self.code, "injected")
        # otherwise: the stream just ends, no `complete`


class CutVllm(vgrpc.VllmEngineServicer):
    async def Generate(self, request, context):
        yield vpb.GenerateResponse(chunk=vpb.GenerateStreamChunk(token_ids=[5]))


@contextlib.asynccontextmanager
async def serve(servicer, add):
    server = grpc.aio.server()
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"grpc://127.0.0.1:{port}"
    finally:
        await server.stop(None)


VIA = {"generate"}  # how `events` reads a stream (the `via` fixture sets it per test)


@pytest.fixture(autouse=True, params=["generate", "stream_into"])
def via(request):
    """Each test reads its streams both ways: EngineClient.generate (an async iterator) and
    EngineClient.stream_into (events handed over as they come; the dispatcher's way)."""
    VIA.clear()
    VIA.add(request.param)
    return request.param


async def read(client, request, got):
    """The stream's events into `got`, read the test's way."""
    if "generate" in VIA:
        async for event in client.generate(request):
            got.append(event)
    else:
        await client.stream_into(request, got.append)


async def run(protocol, url):
    client = client_for(protocol, url, 1)
    got = []
    try:
        with pytest.raises(EngineError) as info:
            await read(client, REQ, got)
    finally:
        await client.close()
    return got, info.value


class WholeSglang(sgrpc.SglangSchedulerServicer):
    async def Generate(self, request, context):
        chunk, complete = spb.GenerateStreamChunk, spb.GenerateComplete
        if request.stream:
            yield spb.GenerateResponse(chunk=chunk(token_ids=[5], completion_tokens=1))
            yield spb.GenerateResponse(chunk=chunk(token_ids=[6, 7], completion_tokens=3))
            done = complete(output_ids=[6, 7], finish_reason="length", prompt_tokens=3)
        else:
            done = complete(output_ids=[5, 6, 7], finish_reason="length", prompt_tokens=3)
        yield spb.GenerateResponse(request_id=request.request_id, complete=done)


class TestWholeStream:
    @pytest.mark.parametrize("stream", [True, False])
    async def test_deltas_then_one_finish(self, stream):
        request = GenerateRequest(
            request_id="r",
            instance_id=1,
            token_ids=[1, 2, 3],
            sampling=SamplingParams(max_tokens=3),
            stream=stream,
        )
        async with serve(WholeSglang(), sgrpc.add_SglangSchedulerServicer_to_server) as url:
            client = client_for("sglang", url, 1)
            got = []
            try:
                await read(client, request, got)
            finally:
                await client.close()
        deltas = (
            [TokenDelta("r", [5]), TokenDelta("r", [6, 7])]
            if stream
            else [TokenDelta("r", [5, 6, 7])]
        )
        assert got[:-1] == deltas
        finished = got[-1]
        assert isinstance(finished, GenerateFinished)
        assert (finished.completion_tokens, finished.finish_reason) == (3, "length")


class TestStreamWithoutFinalMessage:
    async def test_sglang(self):
        async with serve(CutSglang(), sgrpc.add_SglangSchedulerServicer_to_server) as url:
            got, exc = await run("sglang", url)
        assert got == [TokenDelta("r", [5])]
        assert exc.kind == errors.DISCONNECTED

    async def test_vllm(self):
        async with serve(CutVllm(), vgrpc.add_VllmEngineServicer_to_server) as url:
            got, exc = await run("vllm", url)
        assert got == [TokenDelta("r", [5])]
        assert exc.kind == errors.DISCONNECTED


class TestStatusMidStream:
    @pytest.mark.parametrize(
        "code,kind",
        [
            # the engine's own answer on a live connection: this call refused, not down
            (grpc.StatusCode.UNAVAILABLE, errors.REFUSED),
            (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.OVERLOADED),
            (grpc.StatusCode.INVALID_ARGUMENT, errors.BAD_REQUEST),
            (grpc.StatusCode.INTERNAL, errors.ENGINE_ERROR),
        ],
    )
    async def test_sglang(self, code, kind):
        async with serve(CutSglang(code), sgrpc.add_SglangSchedulerServicer_to_server) as url:
            got, exc = await run("sglang", url)
        assert got == [TokenDelta("r", [5])]
        assert (exc.kind, exc.instance_id) == (kind, 1)


class TestConnectionNeverOpens:
    async def test_refused(self):
        with socket.socket() as hole:  # bound, never listening: connections are refused
            hole.bind(("127.0.0.1", 0))
            got, exc = await run("vllm", f"grpc://127.0.0.1:{hole.getsockname()[1]}")
        assert got == []
        assert exc.kind == errors.CANNOT_CONNECT


class StoppedSglang(sgrpc.SglangSchedulerServicer):
    """Sends one chunk, then its whole server stops (no grace): the connection goes."""

    server: grpc.aio.Server

    async def Generate(self, request, context):
        yield spb.GenerateResponse(
            request_id=request.request_id, chunk=spb.GenerateStreamChunk(token_ids=[5])
        )
        await asyncio.sleep(0.05)  # the chunk reaches the client first
        stopping = asyncio.ensure_future(self.server.stop(0))
        await asyncio.sleep(5)
        await stopping


class TestRefusedOrDown:
    """Regression (QA: one UNAVAILABLE took an engine out of rotation): an engine's own
    UNAVAILABLE to one call is kind refused (migrate, not reported down); a connection that
    is refused or lost is cannot_connect (instance down), on both transports."""

    async def test_a_connection_lost_mid_stream_is_cannot_connect(self):
        servicer = StoppedSglang()
        server = servicer.server = grpc.aio.server()
        sgrpc.add_SglangSchedulerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            got, exc = await run("sglang", f"grpc://127.0.0.1:{port}")
        finally:
            await server.stop(None)
        assert got == [TokenDelta("r", [5])]
        assert (exc.kind, exc.instance_id) == (errors.CANNOT_CONNECT, 1)

    async def test_a_refusal_before_the_first_reply_is_refused(self):
        class Refusing(sgrpc.SglangSchedulerServicer):
            async def Generate(self, request, context):
                await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
                yield  # pragma: no cover (a generator: a streaming handler)

        async with serve(Refusing(), sgrpc.add_SglangSchedulerServicer_to_server) as url:
            got, exc = await run("sglang", url)
        assert got == []
        assert (exc.kind, exc.message) == (errors.REFUSED, "UNAVAILABLE: draining")


class TestUnaryRefusedOrDown:
    """The same rule on the grpc.aio channel's unary calls (HealthCheck, Embed, ...)."""

    async def test_an_engine_answering_unavailable_is_refused(self):
        class Draining(sgrpc.SglangSchedulerServicer):
            async def HealthCheck(self, request, context):
                await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")

        async with serve(Draining(), sgrpc.add_SglangSchedulerServicer_to_server) as url:
            client = client_for("sglang", url, 1)
            try:
                with pytest.raises(EngineError) as info:
                    await client.health(2.0)
                with pytest.raises(EngineError) as again:  # the connection is still up
                    await client.health(2.0)
            finally:
                await client.close()
        assert info.value.kind == again.value.kind == errors.REFUSED

    async def test_a_refused_connection_is_cannot_connect(self):
        with socket.socket() as hole:  # bound, never listening: connections are refused
            hole.bind(("127.0.0.1", 0))
            client = client_for("sglang", f"grpc://127.0.0.1:{hole.getsockname()[1]}", 1)
            try:
                with pytest.raises(EngineError) as info:
                    await client.health(2.0)
            finally:
                await client.close()
        assert info.value.kind == errors.CANNOT_CONNECT
