"""ChannelPool draining against a real mock engine: an instance that leaves the routable set
takes no new streams, its running streams finish, the channel closes after the last one; past
the drain timeout the streams left are handed over to be failed; an instance that comes back
while draining keeps its channel and streams.

Regression tests for issue 11: removing an engine cut its live streams after a fixed 30 s by
closing the channel under them, whatever they were doing.
"""

from __future__ import annotations

import asyncio

import msgspec

from switchyard.dispatcher.channels import ChannelPool
from switchyard.dispatcher.streams import run_generation
from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import start_mock_engine
from switchyard.protos.messages import (
    GenerateFinished,
    GenerateRequest,
    Instance,
    InstanceAdded,
    InstanceRemoved,
    SamplingParams,
)


def instance(port: int) -> Instance:
    return Instance(
        instance_id=7,
        url=f"grpc://127.0.0.1:{port}",
        protocol="sglang",
        model="deepseek-mock",
        context_length=4096,
        block_size=16,
    )


def request(rid: str, tokens: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid,
        instance_id=7,
        token_ids=[1, 2, 3, 4],
        sampling=SamplingParams(max_tokens=tokens, ignore_eos=True),
    )


async def until(predicate, what: str, deadline: float = 30.0) -> None:
    async with asyncio.timeout(deadline):
        while not predicate():
            await asyncio.sleep(0.01)
    assert predicate(), what


class Streams:
    """Runs generations on clients from the pool, attached as the service does."""

    def __init__(self, pool: ChannelPool) -> None:
        self.pool = pool
        self.sent: dict[str, list] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, rid: str, tokens: int) -> None:
        client = self.pool.get(7)
        assert client is not None
        sent = self.sent[rid] = []
        task = asyncio.create_task(run_generation(client, request(rid, tokens), sent.append, print))
        self.tasks[rid] = task
        self.pool.attach(client, rid)
        task.add_done_callback(lambda _t: self.pool.detach(client, rid))


class TestDrain:
    async def test_removed_instance_finishes_its_streams_then_closes(self):
        config = MockEngineConfig(protocol="sglang", port=0, itl_ms=20.0)
        async with start_mock_engine(config) as engine:
            pool = ChannelPool(drain_timeout=60.0)
            pool.apply([InstanceAdded(instance(engine.port))])
            client = pool.get(7)
            assert client is not None
            streams = Streams(pool)
            streams.start("a", 30)
            await until(lambda: streams.sent["a"], "first token")
            pool.apply([InstanceRemoved(7, instance(engine.port).url)])
            assert pool.get(7) is None  # no new streams
            assert pool.draining(7) == 1
            await streams.tasks["a"]
            assert isinstance(streams.sent["a"][-1], GenerateFinished)  # ran to completion
            assert sum(len(r.token_ids) for r in streams.sent["a"][:-1]) == 30
            await until(lambda: client.closed, "channel closed after its last stream")
            assert pool.draining(7) == 0
            await pool.close()

    async def test_past_the_drain_timeout_streams_are_handed_over(self):
        config = MockEngineConfig(protocol="sglang", port=0, itl_ms=50.0)
        async with start_mock_engine(config) as engine:
            timed_out: list = []

            def fail(instance_id, keys):
                timed_out.append((instance_id, sorted(keys)))
                for key in keys:
                    streams.tasks[key].cancel()  # as the service does: an Abort each

            pool = ChannelPool(drain_timeout=0.3, on_drain_timeout=fail)
            pool.apply([InstanceAdded(instance(engine.port))])
            client = pool.get(7)
            assert client is not None
            streams = Streams(pool)
            streams.start("long", 100_000)
            streams.start("short", 2)
            await until(lambda: streams.sent["long"] and streams.sent["short"], "tokens")
            pool.apply([InstanceRemoved(7, instance(engine.port).url)])
            await until(lambda: timed_out, "the drain timeout")
            assert timed_out == [(7, ["long"])]  # the short one had finished
            await until(lambda: client.closed, "channel closed once the last stream left")
            assert engine.engine is not None and engine.engine.aborts == 1
            await pool.close()

    async def test_instance_back_while_draining_keeps_its_channel(self):
        config = MockEngineConfig(protocol="sglang", port=0, itl_ms=20.0)
        async with start_mock_engine(config) as engine:
            timed_out: list = []
            pool = ChannelPool(drain_timeout=0.2, on_drain_timeout=lambda i, k: timed_out.append(k))
            inst = instance(engine.port)
            pool.apply([InstanceAdded(inst)])
            client = pool.get(7)
            streams = Streams(pool)
            streams.start("a", 40)
            await until(lambda: streams.sent["a"], "first token")
            pool.apply([InstanceRemoved(7, inst.url)])
            pool.apply([InstanceAdded(inst)])
            assert pool.get(7) is client and pool.draining(7) == 0
            await streams.tasks["a"]
            await asyncio.sleep(0.3)  # past the (cancelled) drain timeout
            assert timed_out == [] and not client.closed
            assert isinstance(streams.sent["a"][-1], GenerateFinished)
            await pool.close()

    async def test_idle_removed_instance_closes_at_once(self):
        config = MockEngineConfig(protocol="vllm", port=0)
        async with start_mock_engine(config) as engine:
            pool = ChannelPool(drain_timeout=60.0)
            inst = msgspec.structs.replace(instance(engine.port), protocol="vllm")
            pool.apply([InstanceAdded(inst)])
            client = pool.get(7)
            assert client is not None
            pool.apply([InstanceRemoved(7, inst.url)])
            await until(lambda: client.closed, "closed")
            await pool.close()


class TestEngineStreams:
    """`--engine-streams`: Generate streams on the loop's HTTP/2 connection (the default)
    or on the grpc.aio channel; either way a generation runs to its finish."""

    async def run_one(self, http2: bool) -> tuple[bool, list]:
        config = MockEngineConfig(protocol="sglang", port=0, ttft_ms=0, itl_ms=0)
        async with start_mock_engine(config) as engine:
            pool = ChannelPool(http2_streams=http2)
            try:
                pool.apply([InstanceAdded(instance(engine.port))])
                client = pool.get(7)
                assert client is not None
                sent: list = []
                await run_generation(client, request("r", 4), sent.append, print)
                return client.streams is not None, sent
            finally:
                await pool.close()

    async def test_http2_by_default_and_grpc_on_request(self):
        for http2 in (True, False):
            on_http2, sent = await self.run_one(http2)
            assert on_http2 is http2
            assert isinstance(sent[-1], GenerateFinished) and sent[-1].completion_tokens == 4
            assert sum(len(e.token_ids) for e in sent[:-1]) == 4

    def test_an_unknown_transport_is_refused(self):
        import pytest

        from switchyard.dispatcher.service import DispatcherService

        with pytest.raises(ValueError, match="--engine-streams"):
            DispatcherService("tcp://127.0.0.1:0", "tcp://x:1", "tcp://x:2", engine_streams="h3")
