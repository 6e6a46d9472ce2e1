"""The cache through the gRPC APIs of both protocols: SubscribeKvEvents (live with load
records, refused resumes, UNIMPLEMENTED without a publisher, every DP rank, ended by a stop),
cached_tokens in chunks and completes, loads, server info and FlushCache."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as spb_grpc
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from smg_grpc_proto.generated import common_pb2

from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.kv_grpc import to_int64
from switchyard.mock_engine.server import MockEngineServer, start_mock_engine

BS = 4
PROMPT = list(range(100, 114))  # three full blocks and two tokens


def config(protocol: str, **overrides: Any) -> MockEngineConfig:
    settings: dict[str, Any] = {
        "protocol": protocol,
        "port": 0,
        "speedup": 1000.0,
        "block_size": BS,
        "kv_hash_seed": 5,
    }
    settings.update(overrides)
    return MockEngineConfig(**settings)


def stub_of(server: MockEngineServer, channel: grpc.aio.Channel) -> Any:
    if server.config.protocol == "sglang":
        return spb_grpc.SglangSchedulerStub(channel)
    return vpb_grpc.VllmEngineStub(channel)


async def generate(
    server: MockEngineServer, stub: Any, rid: str, prompt: list[int], max_tokens: int = 3
) -> list[Any]:
    if server.config.protocol == "sglang":
        request = spb.GenerateRequest(
            request_id=rid,
            tokenized=spb.TokenizedInput(input_ids=prompt),
            sampling_params=spb.SamplingParams(
                temperature=0.0, top_k=-1, max_new_tokens=max_tokens, ignore_eos=True
            ),
            stream=True,
        )
    else:
        request = vpb.GenerateRequest(
            request_id=rid,
            tokenized=vpb.TokenizedInput(input_ids=prompt),
            sampling_params=vpb.SamplingParams(
                temperature=0.0, max_tokens=max_tokens, ignore_eos=True
            ),
            stream=True,
        )
    return [reply async for reply in stub.Generate(request)]


def signed_chain(server: MockEngineServer, prompt: list[int]) -> list[int]:
    assert server.engine is not None
    return [to_int64(h) for h in server.engine.cache.hasher.chain(prompt, BS)]


class TestToInt64:
    def test_same_bits(self) -> None:
        assert to_int64(5) == 5
        assert to_int64((1 << 63) - 1) == (1 << 63) - 1
        assert to_int64(1 << 63) == -(1 << 63)
        assert to_int64((1 << 64) - 1) == -1


EVENTS = {"kv_events_endpoint": "tcp://127.0.0.1:*"}


def pinned(server: MockEngineServer, rid: str, prompt: list[int], rank: int) -> Any:
    """A one-token request pinned to a data-parallel rank."""
    if server.config.protocol == "sglang":
        return spb.GenerateRequest(
            request_id=rid,
            tokenized=spb.TokenizedInput(input_ids=prompt),
            sampling_params=spb.SamplingParams(temperature=0.0, top_k=-1, max_new_tokens=1),
            data_parallel_rank=rank,
        )
    return vpb.GenerateRequest(
        request_id=rid,
        tokenized=vpb.TokenizedInput(input_ids=prompt),
        sampling_params=vpb.SamplingParams(temperature=0.0, max_tokens=1),
        data_parallel_rank=rank,
    )


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
class TestSubscribeKvEvents:
    """As the stock servicers' relay (smg-grpc-servicer) answers it."""

    async def test_live_stream_with_load_records(self, protocol: str) -> None:
        async with start_mock_engine(config(protocol, **EVENTS)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = stub_of(server, channel)
                call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
                await call.initial_metadata()  # subscribed from here on
                await generate(server, stub, "a", PROMPT, max_tokens=1)  # prompt blocks only
                await generate(server, stub, "b", PROMPT[:8] + [9, 9, 9, 9, 9], max_tokens=1)
                first = await call.read()
                second = await call.read()
                call.cancel()
        hashes = signed_chain(server, PROMPT)
        offset = 1 if protocol == "sglang" else 0  # SGLang's AllBlocksCleared was 0
        assert (first.sequence_number, second.sequence_number) == (offset, offset + 1)
        assert first.dp_rank == 0 and first.timestamp > 0
        (event,) = first.events
        assert event.event_id == 1 and event.WhichOneof("data") == "stored"
        assert [b.block_hash for b in event.stored.blocks] == hashes
        assert [list(b.token_ids) for b in event.stored.blocks] == [
            PROMPT[0:4],
            PROMPT[4:8],
            PROMPT[8:12],
        ]
        assert {b.block_size for b in event.stored.blocks} == {BS}
        assert not event.stored.HasField("parent_block_hash")
        assert event.stored.medium == "GPU"
        (event,) = second.events
        assert event.event_id == 2 and event.stored.parent_block_hash == hashes[1]
        assert [list(b.token_ids) for b in event.stored.blocks] == [[9, 9, 9, 9]]
        # Every batch carries the engine's load; the telemetry only the first record.
        assert first.HasField("load") and first.load.max_running_requests > 0
        assert (first.load.sample, second.load.sample) == (1, 2)
        assert first.load.HasField("max_total_num_tokens")
        assert not second.load.HasField("max_total_num_tokens")
        assert not first.load.load_only

    async def test_unimplemented_without_a_publisher(self, protocol: str) -> None:
        async with start_mock_engine(config(protocol)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                call = stub_of(server, channel).SubscribeKvEvents(
                    common_pb2.SubscribeKvEventsRequest()
                )
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await call.read()
        assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED

    async def test_resuming_is_out_of_range(self, protocol: str) -> None:
        async with start_mock_engine(config(protocol, **EVENTS)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = stub_of(server, channel)
                await generate(server, stub, "r", [3000] * 6)
                request = common_pb2.SubscribeKvEventsRequest(start_sequence_number=1)
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    async for _ in stub.SubscribeKvEvents(request):
                        pass
        assert raised.value.code() == grpc.StatusCode.OUT_OF_RANGE

    async def test_heartbeat_before_the_first_batch(self, protocol: str) -> None:
        async with start_mock_engine(config(protocol, **EVENTS)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                call = stub_of(server, channel).SubscribeKvEvents(
                    common_pb2.SubscribeKvEventsRequest(load_records_before_first_batch=True)
                )
                beat = await call.read()  # the first record is new: it goes out at once
                call.cancel()
        assert beat.load.load_only and beat.sequence_number == 0 and not beat.events

    async def test_every_rank_in_one_stream(self, protocol: str) -> None:
        async with start_mock_engine(config(protocol, dp_size=2, **EVENTS)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = stub_of(server, channel)
                call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
                await call.initial_metadata()
                async for _ in stub.Generate(pinned(server, "one", PROMPT, rank=1)):
                    pass
                batch = await call.read()
                call.cancel()
        offset = 1 if protocol == "sglang" else 0
        assert (batch.dp_rank, batch.sequence_number) == (1, offset)
        assert batch.HasField("load") and batch.load.max_running_requests > 0

    async def test_stream_ends_when_the_engine_stops(self, protocol: str) -> None:
        server = MockEngineServer(config(protocol, **EVENTS))
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.target) as channel:
                call = stub_of(server, channel).SubscribeKvEvents(
                    common_pb2.SubscribeKvEventsRequest()
                )
                await call.initial_metadata()
                await server.stop(grace_s=5.0)
                assert await call.read() == grpc.aio.EOF
                assert await call.code() == grpc.StatusCode.OK
        finally:
            await server.stop()


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
class TestCachedTokens:
    async def test_chunks_and_complete(self, protocol: str) -> None:
        async with start_mock_engine(config(protocol)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = stub_of(server, channel)
                cold = await generate(server, stub, "c", PROMPT)
                warm = await generate(server, stub, "w", PROMPT[:12] + [1, 2, 3])
        assert {r.chunk.cached_tokens for r in cold if r.HasField("chunk")} == {0}
        assert cold[-1].complete.cached_tokens == 0
        assert {r.chunk.cached_tokens for r in warm if r.HasField("chunk")} == {12}
        assert warm[-1].complete.cached_tokens == 12

    async def test_loads_and_flush(self, protocol: str) -> None:
        pb = spb if protocol == "sglang" else vpb
        async with start_mock_engine(config(protocol)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = stub_of(server, channel)
                await generate(server, stub, "x", PROMPT)
                await generate(server, stub, "y", PROMPT)
                load = (await stub.GetLoads(pb.GetLoadsRequest())).loads[0]
                assert load.num_used_tokens == 0 and load.token_usage == 0  # nothing running
                assert load.cache_hit_rate > 0
                assert load.max_total_num_tokens == server.config.kv_pool_tokens
                flushed = await stub.FlushCache(common_pb2.FlushCacheRequest())
                assert flushed.success
                assert server.engine is not None and server.engine.cache.cached_blocks == 0


class TestServerInfo:
    async def test_sglang_advertises_its_kv_events_config(self) -> None:
        """As configured, a port 0 shown as the port it bound (a consumer can use it)."""
        settings = config(
            "sglang",
            kv_events_endpoint="tcp://*:0",
            kv_replay_endpoint="tcp://*:0",
            kv_events_topic="kv",
        )
        async with start_mock_engine(settings) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = spb_grpc.SglangSchedulerStub(channel)
                info = await stub.GetServerInfo(spb.GetServerInfoRequest())
        advertised = json_format.MessageToDict(info.server_args)["kv_events_config"]
        pub_port = server.kv_events_endpoint.rpartition(":")[2]
        replay_port = server.kv_replay_endpoint.rpartition(":")[2]
        assert json.loads(advertised) == {
            "publisher": "zmq",
            "endpoint": f"tcp://*:{pub_port}",
            "replay_endpoint": f"tcp://*:{replay_port}",
            "buffer_steps": 10000,
            "hwm": 100000,
            "max_queue_size": 100000,
            "topic": "kv",
        }
