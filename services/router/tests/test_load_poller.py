"""GetLoads polled from real mock engines (both protocols, two DP ranks): one report per
rank, in the workers' EngineLoad objects."""

import asyncio

import grpc
import pytest

from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import start_mock_engine
from switchyard.protos.messages import Instance
from switchyard.router.load import EngineLoads
from switchyard.router.load_poller import LoadPoller


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
async def test_reports_per_rank(protocol):
    config = MockEngineConfig(protocol=protocol, port=0, dp_size=2)
    async with start_mock_engine(config) as engine:
        instance = Instance(
            instance_id=7,
            url=f"grpc://{engine.target}",
            protocol=protocol,
            model="m",
            context_length=1024,
            block_size=16,
            dp_size=2,
        )
        loads = EngineLoads()
        poller = LoadPoller(loads, interval=0.05)
        poller.apply({7: instance})
        try:
            for _ in range(200):
                if loads.load((7, 0)).at >= 0 and loads.load((7, 1)).at >= 0:
                    break
                await asyncio.sleep(0.02)
        finally:
            await poller.close()
        for rank in (0, 1):
            report = loads.load((7, rank))
            assert report.at >= 0 and report.max_running > 0 and report.running == 0
        assert poller.polls >= 1 and poller.failures == 0


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        LoadPoller(EngineLoads(), interval=0)


async def test_an_engine_without_get_loads_is_polled_once():
    server = grpc.aio.server()  # no service at all: every method answers UNIMPLEMENTED
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    instance = Instance(
        instance_id=3,
        url=f"grpc://127.0.0.1:{port}",
        protocol="sglang",
        model="m",
        context_length=1024,
        block_size=16,
    )
    poller = LoadPoller(EngineLoads(), interval=0.02)
    try:
        poller.apply({3: instance})
        await asyncio.sleep(0.3)  # ~15 ticks
    finally:
        await poller.close()
        await server.stop(None)
    assert poller.polls == 1 and poller.failures == 0
