"""Unary calls (EngineClient._unary, through get_loads) on either transport: the gRPC channel,
or the client's own HTTP/2 streams (the router's load polls). Both give the same reply and
fail the same ways: a status keeps its code, a silent engine is kind timeout."""

import asyncio
import contextlib

import grpc
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as spb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sgrpc

from switchyard.common import errors
from switchyard.common.engines.connect import client_for, connect
from switchyard.common.errors import EngineError
from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import start_mock_engine

pytestmark = pytest.mark.usefixtures("both_transports")


class Loads(sgrpc.SglangSchedulerServicer):
    def __init__(self, delay: float = 0.0, code: grpc.StatusCode | None = None) -> None:
        self.delay = delay
        self.code = code
        self.calls = 0

    async def GetLoads(self, request, context):
        self.calls += 1
        if self.code is not None:
            await context.abort(self.code, "injected")
        await asyncio.sleep(self.delay)
        return spb.GetLoadsResponse(
            dp_rank_count=2,
            loads=[spb.SchedulerLoad(dp_rank=r, num_running_reqs=3 + r) for r in (0, 1)],
        )


@contextlib.asynccontextmanager
async def engine(servicer: sgrpc.SglangSchedulerServicer):
    server = grpc.aio.server()
    sgrpc.add_SglangSchedulerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = client_for("sglang", f"grpc://127.0.0.1:{port}", 4)
    try:
        yield client
    finally:
        await client.close()
        await server.stop(None)


async def test_the_reply():
    async with engine(Loads()) as client:
        reply = await client.get_loads(2.0)
        again = await client.get_loads(2.0)  # the same connection, a second call
    assert [(load.dp_rank, load.num_running_reqs) for load in reply.loads] == [(0, 3), (1, 4)]
    assert again == reply
    assert (await _load_of(Loads())).running == 7


async def _load_of(servicer):
    async with engine(servicer) as client:
        return await client.load(2.0)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.UNIMPLEMENTED, errors.BAD_REQUEST),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.OVERLOADED),
        (grpc.StatusCode.INTERNAL, errors.ENGINE_ERROR),
    ],
)
async def test_a_status_keeps_its_code(code, kind):
    async with engine(Loads(code=code)) as client:
        with pytest.raises(EngineError) as info:
            await client.get_loads(2.0)
    assert info.value.code == code and info.value.kind == kind
    assert info.value.instance_id == 4


async def test_an_engine_without_the_method():
    async with engine(sgrpc.SglangSchedulerServicer()) as client:
        with pytest.raises(EngineError) as info:
            await client.get_loads(2.0)
    assert info.value.code == grpc.StatusCode.UNIMPLEMENTED


async def test_a_silent_engine_times_out_and_the_client_goes_on():
    servicer = Loads(delay=5.0)
    async with engine(servicer) as client:
        with pytest.raises(EngineError) as info:
            await client.get_loads(0.2)
        assert info.value.kind == errors.TIMEOUT
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        servicer.delay = 0.0
        assert len((await client.get_loads(2.0)).loads) == 2  # the next call is answered


async def test_a_closed_client_is_disconnected():
    async with engine(Loads()) as client:
        await client.close()
        with pytest.raises(EngineError) as info:
            await client.get_loads(2.0)
    assert info.value.kind == errors.DISCONNECTED


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
async def test_fleet_probes_on_a_mock_engine(protocol):
    """HealthCheck, GetModelInfo and GetServerInfo (fleet's probe), and the client that
    connect() makes for fleet, over either transport."""
    async with start_mock_engine(MockEngineConfig(protocol=protocol, port=0)) as mock:
        url = f"grpc://{mock.target}"
        client = client_for(protocol, url, 4)
        probed = await connect(url, 2.0, 4, http2_streams=True)
        try:
            assert await client.health(2.0)
            info = await client.info(2.0)
            assert info.protocol == protocol and info.context_length > 0
            assert probed.streams is not None and probed.protocol == protocol
            assert await probed.health(2.0) and await probed.info(2.0) == info
        finally:
            await client.close()
            await probed.close()


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
async def test_an_engine_whose_health_service_is_not_serving_is_unhealthy(protocol):
    """vLLM's servicer answers HealthCheck healthy during its warm-up and holds the standard
    health service at NOT_SERVING until it is over (found on a real vLLM: engines were
    admitted mid-warm-up, 128 warm-up requests running)."""
    from grpc_health.v1 import health_pb2

    async with start_mock_engine(MockEngineConfig(protocol=protocol, port=0)) as mock:
        client = client_for(protocol, f"grpc://{mock.target}", 4)
        try:
            assert await client.health(2.0)
            await mock._health.set(client.service_name, health_pb2.HealthCheckResponse.NOT_SERVING)
            assert not await client.health(2.0)
            await mock._health.set(client.service_name, health_pb2.HealthCheckResponse.SERVING)
            assert await client.health(2.0)
        finally:
            await client.close()


class Healthy(sgrpc.SglangSchedulerServicer):
    async def HealthCheck(self, request, context):
        return spb.HealthCheckResponse(healthy=True)


async def test_an_engine_without_the_standard_health_service_is_judged_by_healthcheck():
    async with engine(Healthy()) as client:
        assert await client.health(2.0)


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
async def test_an_http2_client_opens_its_channel_only_for_a_channel_call(protocol):
    """Fleet's probes and the router's load polls never touch the gRPC channel, so their
    clients never start gRPC core's threads; Abort (a channel call) opens it then."""
    async with start_mock_engine(MockEngineConfig(protocol=protocol, port=0)) as mock:
        url = f"grpc://{mock.target}"
        probed = await connect(url, 2.0, 4, http2_streams=True)
        polled = client_for(protocol, url, 4)
        try:
            assert await probed.health(2.0) and (await probed.info(2.0)).protocol == protocol
            await polled.get_loads(2.0)
            assert probed._channel is None
            assert (polled._channel is None) == (polled.streams is not None)
            await probed.abort("nobody", 2.0)
            assert probed._channel is not None
        finally:
            await probed.close()
            await polled.close()
        with pytest.raises(EngineError) as info:
            await polled.abort("nobody", 2.0)
        assert info.value.kind == errors.DISCONNECTED
