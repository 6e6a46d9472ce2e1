"""Data-parallel ranks: a per-rank cache and publisher (base port + rank), requests pinned
with data_parallel_rank, out-of-range pins refused, loads and server info per rank."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc
import msgspec
import pytest
from google.protobuf import json_format
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as spb_grpc
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from support.mock_engine import kv_replay

from switchyard.common.ports import free_port
from switchyard.mock_engine.config import MockEngineConfig, default_tokenizer_dir
from switchyard.mock_engine.data_parallel import DataParallelEngine
from switchyard.mock_engine.server import MockEngineServer, start_mock_engine
from switchyard.mock_engine.tests.test_generation import make_engine
from switchyard.mock_engine.tokenizer_facts import load_tokenizer_facts
from switchyard.mock_engine.types import FinishReason, GenerationRequest, SamplingSpec

BS = 4
PROMPT = list(range(200, 216))
PROMPT_IDS = (100, 200, 300, 400)


def config(protocol: str, fixed_ports: bool = False, **overrides: Any) -> MockEngineConfig:
    """Two ranks; KV sockets at a base port, rank r at base + r, as the engines number them:
    port 0 (rank 0 binds a free port, rank 1 the next), or with `fixed_ports` given ones."""
    pub, replay, host = 0, 0, "127.0.0.1"  # a named host with port 0 still binds
    if fixed_ports:
        pub, replay, host = free_port(), free_port(), "*"
        while abs(replay - pub) <= 1:
            replay = free_port()
    settings: dict[str, Any] = {
        "protocol": protocol,
        "port": 0,
        "speedup": 1000.0,
        "block_size": BS,
        "dp_size": 2,
        "kv_hash_seed": 3,
        "kv_events_endpoint": f"tcp://{host}:{pub}",
        "kv_replay_endpoint": f"tcp://{host}:{replay}",
    }
    settings.update(overrides)
    return MockEngineConfig(**settings)


@contextlib.asynccontextmanager
async def engine_on_fixed_ports(protocol: str) -> AsyncIterator[MockEngineServer]:
    """The engine with base + rank ports; base + 1 may be taken on a shared machine (the
    ports are only checked free, not held), so a few bases are tried."""
    for attempt in range(5):
        server = MockEngineServer(config(protocol, fixed_ports=True))
        try:
            await server.start()  # a bind failure leaves nothing running
        except OSError:
            if attempt == 4:
                raise
            continue
        break
    try:
        yield server
    finally:
        await server.stop(1.0)


def stub_and_request(protocol: str, channel: grpc.aio.Channel, rid: str, rank: int | None):
    if protocol == "sglang":
        request = spb.GenerateRequest(
            request_id=rid,
            tokenized=spb.TokenizedInput(input_ids=PROMPT),
            sampling_params=spb.SamplingParams(temperature=0.0, top_k=-1, max_new_tokens=1),
        )
        stub: Any = spb_grpc.SglangSchedulerStub(channel)
    else:
        request = vpb.GenerateRequest(
            request_id=rid,
            tokenized=vpb.TokenizedInput(input_ids=PROMPT),
            sampling_params=vpb.SamplingParams(temperature=0.0, max_tokens=1),
        )
        stub = vpb_grpc.VllmEngineStub(channel)
    if rank is not None:
        request.data_parallel_rank = rank
    return stub, request


@contextlib.asynccontextmanager
async def engine_on_port_0(protocol: str) -> AsyncIterator[MockEngineServer]:
    async with start_mock_engine(config(protocol)) as server:
        yield server


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
class TestDataParallel:
    @pytest.mark.parametrize("start", [engine_on_fixed_ports, engine_on_port_0])
    async def test_pinned_request_fills_its_ranks_cache_and_publisher(
        self, protocol, start
    ) -> None:
        async with start(protocol) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub, request = stub_and_request(protocol, channel, "a", rank=1)
                async for _ in stub.Generate(request):
                    pass
                assert server.engine is not None
                rank0, rank1 = server.engine.ranks
                assert rank0.cache.cached_blocks == 0 and rank1.cache.cached_blocks == 4
                # Rank r publishes on base port + r, its replay likewise.
                endpoints = server.kv_events_endpoints
                base = int(endpoints[0].rsplit(":", 1)[1])
                assert base != 0
                assert [int(e.rsplit(":", 1)[1]) for e in endpoints] == [base, base + 1]
                assert not any(t.connects for t in server._transports)  # every rank binds
                replays = server.kv_replay_endpoints
                first = int(replays[0].rsplit(":", 1)[1])
                assert [int(e.rsplit(":", 1)[1]) for e in replays] == [first, first + 1]
                stored = await kv_replay(replays[1], 0)
                batches = [msgspec.msgpack.decode(frames[2]) for frames in stored[:-1]]
                assert batches[-1][2] == 1  # the payload names its rank
                assert any(e.get("type") == "BlockStored" for b in batches for e in b[1])

    async def test_unpinned_requests_go_to_the_least_busy_rank(self, protocol) -> None:
        async with start_mock_engine(config(protocol, speedup=1.0)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                calls = []
                for rid in ("a", "b"):
                    stub, request = stub_and_request(protocol, channel, rid, rank=None)
                    sampling = request.sampling_params
                    if protocol == "sglang":
                        sampling.max_new_tokens, sampling.ignore_eos = 500, True
                    else:
                        sampling.max_tokens, sampling.ignore_eos = 500, True
                    request.stream = True
                    call = stub.Generate(request)
                    await call.read()  # running now
                    calls.append(call)
                assert server.engine is not None
                assert [r.active_requests for r in server.engine.ranks] == [1, 1]
                for call in calls:
                    call.cancel()

    async def test_abort_of_an_n_request_stops_its_samples_on_every_rank(self, protocol) -> None:
        """n = 2 unpinned: the samples run on both ranks; one Abort ends them all."""
        async with start_mock_engine(config(protocol, speedup=1.0)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub, request = stub_and_request(protocol, channel, "g", rank=None)
                sampling = request.sampling_params
                sampling.n, sampling.ignore_eos = 2, True
                if protocol == "sglang":
                    sampling.max_new_tokens = 500
                    abort: Any = spb.AbortRequest(request_id="g")
                else:
                    sampling.max_tokens = 500
                    abort = vpb.AbortRequest(request_ids=["g"])
                request.stream = True
                call = stub.Generate(request)
                await call.read()  # running now
                assert server.engine is not None
                assert [r.active_requests for r in server.engine.ranks] == [1, 1]
                await stub.Abort(abort)
                try:  # it ends, it does not hang (SGLang: with "Request aborted")
                    while await call.read() is not grpc.aio.EOF:
                        pass
                except grpc.aio.AioRpcError as exc:
                    assert protocol == "sglang" and "aborted" in (exc.details() or "")
                assert server.engine.active_requests == 0

    async def test_rank_out_of_range_is_invalid(self, protocol) -> None:
        async with start_mock_engine(config(protocol)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub, request = stub_and_request(protocol, channel, "x", rank=5)
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    async for _ in stub.Generate(request):
                        pass
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "data_parallel_rank 5" in raised.value.details()

    async def test_loads_and_server_info_per_rank(self, protocol) -> None:
        async with start_mock_engine(config(protocol)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                if protocol == "sglang":
                    stub: Any = spb_grpc.SglangSchedulerStub(channel)
                    loads = await stub.GetLoads(spb.GetLoadsRequest())
                    info = await stub.GetServerInfo(spb.GetServerInfoRequest())
                    assert json_format.MessageToDict(info.server_args)["dp_size"] == 2
                else:
                    stub = vpb_grpc.VllmEngineStub(channel)
                    loads = await stub.GetLoads(vpb.GetLoadsRequest())
                    info = await stub.GetServerInfo(vpb.GetServerInfoRequest())
                    assert info.data_parallel_size == 2
        assert [load.dp_rank for load in loads.loads] == [0, 1]
        assert loads.dp_rank_count == 2


async def test_abort_by_group_reaches_every_rank() -> None:
    """The samples of an n > 1 request may run on different ranks: aborting the caller's id
    must stop each of them, not only the first rank's."""
    facts = load_tokenizer_facts(default_tokenizer_dir())
    engine = DataParallelEngine(
        [make_engine(facts, context_length=100_000, itl_s=0.05) for _ in range(2)]
    )
    spec = SamplingSpec(ignore_eos=True)
    jobs = [
        GenerationRequest(f"g-{rank}", PROMPT_IDS, spec, group="g", dp_rank=rank) for rank in (0, 1)
    ]
    ends: list[FinishReason] = []

    async def run(job: GenerationRequest) -> None:
        async with aclosing(engine.generate(job)) as steps:
            async for step in steps:
                if step.finish is not None:
                    ends.append(step.finish.reason)

    tasks = [asyncio.create_task(run(job)) for job in jobs]
    while [r.active_requests for r in engine.ranks] != [1, 1]:
        await asyncio.sleep(0.01)
    assert engine.abort("g")
    async with asyncio.timeout(10):
        await asyncio.gather(*tasks)
    assert ends == [FinishReason.ABORT, FinishReason.ABORT]
