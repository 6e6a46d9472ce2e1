import asyncio

import pytest

from switchyard.common import errors
from switchyard.common.engines import EngineInfo
from switchyard.common.errors import EngineError
from switchyard.common.workers import WorkerSpec
from switchyard.fleet.prober import Prober

A = WorkerSpec("grpc://a:1")
B = WorkerSpec("grpc://b:1")
INFO = EngineInfo(protocol="vllm", model="m", context_length=10, block_size=16)


class FakeClient:
    def __init__(self) -> None:
        self.healthy = True
        self.error: EngineError | None = None
        self.delay = 0.0
        self.closed = False

    async def health(self, timeout: float) -> bool:
        await asyncio.sleep(self.delay)
        return self.healthy

    async def info(self, timeout: float) -> EngineInfo:
        if self.error is not None:
            raise self.error
        return INFO

    async def close(self) -> None:
        self.closed = True


class FakeConnect:
    def __init__(self) -> None:
        self.clients: list[FakeClient] = []

    async def __call__(self, url, timeout, instance_id):
        client = FakeClient()
        self.clients.append(client)
        return client


@pytest.fixture
async def connect():
    return FakeConnect()


@pytest.fixture
async def prober(connect):
    p = Prober(timeout=0.2, connect=connect)
    yield p
    await p.close()


class TestProber:
    async def test_client_cached_per_url(self, prober, connect):
        assert await prober.probe(A) == INFO
        assert await prober.probe(A) == INFO
        await prober.probe(B)
        assert len(connect.clients) == 2

    async def test_unreachable_engine_keeps_its_channel(self, prober, connect):
        await prober.probe(A)
        connect.clients[0].error = EngineError(errors.CANNOT_CONNECT, "refused")
        with pytest.raises(EngineError):
            await prober.probe(A)
        assert not connect.clients[0].closed
        connect.clients[0].error = None
        await prober.probe(A)
        assert len(connect.clients) == 1

    async def test_family_change_reconnects(self, prober, connect):
        await prober.probe(A)
        connect.clients[0].error = EngineError(errors.BAD_REQUEST, "UNIMPLEMENTED")
        with pytest.raises(EngineError):
            await prober.probe(A)
        assert connect.clients[0].closed
        await prober.probe(A)
        assert len(connect.clients) == 2

    async def test_unhealthy_is_an_error(self, prober, connect):
        await prober.probe(A)
        connect.clients[0].healthy = False
        with pytest.raises(EngineError, match="unhealthy"):
            await prober.probe(A)

    async def test_timeout_is_engine_error_kind_timeout(self, prober, connect):
        await prober.probe(A)
        connect.clients[0].delay = 5.0
        with pytest.raises(EngineError) as info:
            await prober.probe(A)
        assert info.value.kind == errors.TIMEOUT

    async def test_retain_and_close_close_channels(self, prober, connect):
        await prober.probe(A)
        await prober.probe(B)
        await prober.retain({B.url})
        assert [c.closed for c in connect.clients] == [True, False]
        await prober.close()
        assert connect.clients[1].closed
