"""The cache through the gRPC APIs of both protocols: SubscribeKvEvents (live, resumed,
truncated, ended by a stop), cached_tokens in chunks and completes, loads, server info and
FlushCache."""

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


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
class TestSubscribeKvEvents:
    async def test_live_stream(self, protocol: str) -> None:
        async with start_mock_engine(config(protocol)) as server:
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

    async def test_resume_replays_first(self, protocol: str) -> None:
        async with start_mock_engine(config(protocol)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = stub_of(server, channel)
                for i in range(3):
                    await generate(server, stub, f"r{i}", [3000 + i] * 6)
                assert server.kv_events is not None
                last = server.kv_events.next_seq - 1
                call = stub.SubscribeKvEvents(
                    common_pb2.SubscribeKvEventsRequest(start_sequence_number=last - 1)
                )
                await call.initial_metadata()
                await generate(server, stub, "live", [4000] * 6)
                seqs = [(await call.read()).sequence_number for _ in range(3)]
                call.cancel()
        assert seqs == [last - 1, last, last + 1]

    async def test_resume_before_the_buffer_is_out_of_range(self, protocol: str) -> None:
        async with start_mock_engine(config(protocol, kv_replay_buffer=1)) as server:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = stub_of(server, channel)
                for i in range(3):
                    await generate(server, stub, f"t{i}", [5000 + i] * 6)
                request = common_pb2.SubscribeKvEventsRequest(start_sequence_number=1)
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    async for _ in stub.SubscribeKvEvents(request):
                        pass
        assert raised.value.code() == grpc.StatusCode.OUT_OF_RANGE

    async def test_stream_ends_when_the_engine_stops(self, protocol: str) -> None:
        server = MockEngineServer(config(protocol))
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
    async def test_sglang_advertises_its_kv_events_config_verbatim(self) -> None:
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
        assert json.loads(advertised) == {
            "publisher": "zmq",
            "endpoint": "tcp://*:0",
            "replay_endpoint": "tcp://*:0",
            "buffer_steps": 10000,
            "hwm": 100000,
            "max_queue_size": 100000,
            "topic": "kv",
        }
