"""The mock engine's gRPC server enforces the stock servers' HTTP/2 ping policy, family by
family (issue 14: the mock answered the dispatcher's 10 s keepalive pings with GOAWAY
too_many_pings, which neither stock server does)."""

from __future__ import annotations

import asyncio
import time

import grpc

from switchyard.common.engines.base import KEEPALIVE_TIME_MS
from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import start_mock_engine

# Far faster than the servers' 10 s floor: every ping after the first is a strike.
EAGER = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


async def goaway_within(protocol: str, seconds: float) -> bool:
    """Whether an eager pinger's connection is sent away within `seconds` (it goes IDLE)."""
    async with start_mock_engine(MockEngineConfig(protocol=protocol, port=0)) as engine:
        async with grpc.aio.insecure_channel(engine.target, options=EAGER) as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if channel.get_state() != grpc.ChannelConnectivity.READY:
                    return True
                await asyncio.sleep(0.05)
    return False


class TestPingPolicy:
    async def test_sglang_strikes_and_vllm_does_not(self):
        """SGLang keeps gRPC's 2 ping strikes (the third early ping earns GOAWAY); vLLM 0.30+
        sets max_ping_strikes 0. Both accept a ping every 10 s without data."""
        sglang, vllm = await asyncio.gather(goaway_within("sglang", 6), goaway_within("vllm", 6))
        assert sglang is True
        assert vllm is False

    def test_the_dispatcher_pings_no_faster_than_both_servers_accept(self):
        assert KEEPALIVE_TIME_MS > 10_000  # min_ping_interval_without_data_ms of both
