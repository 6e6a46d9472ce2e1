"""KV events on real ZMQ sockets, read as a consumer reads them: the PUB frames and payloads
(both event forms, hash bytes, topics, sequence numbers), SGLang's start, repeated prompts,
the replay ROUTER (both framings, end marker, resume in the middle) and --kv-skip-seq."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from support.mock_engine import END_SEQ, kv_replay, kv_subscriber

from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import MockEngineServer, start_mock_engine
from switchyard.mock_engine.types import GenerationRequest, SamplingSpec

ANY_PORT = "tcp://127.0.0.1:*"
BS = 4


@contextlib.asynccontextmanager
async def engine_with_events(protocol: str, **overrides: Any) -> AsyncIterator[MockEngineServer]:
    settings: dict[str, Any] = {
        "protocol": protocol,
        "port": 0,
        "speedup": 1000.0,
        "block_size": BS,
        "kv_events_endpoint": ANY_PORT,
        "kv_replay_endpoint": ANY_PORT,
        "kv_hash_seed": 99,
    }
    settings.update(overrides)
    async with start_mock_engine(MockEngineConfig(**settings)) as server:
        yield server


async def generate(server: MockEngineServer, rid: str, prompt: Sequence[int]) -> None:
    """One request to the engine's core, one output token (so only prompt blocks are stored)."""
    assert server.engine is not None
    request = GenerationRequest(rid, tuple(prompt), SamplingSpec(max_new_tokens=1))
    async with aclosing(server.engine.generate(request)) as steps:
        async for _ in steps:
            pass


async def receive(sub: zmq.asyncio.Socket, count: int) -> list[tuple[bytes, int, Any]]:
    """`count` PUB messages as (topic, seq, decoded payload)."""
    out: list[tuple[bytes, int, Any]] = []
    for _ in range(count):
        assert await sub.poll(5000), f"only {len(out)} of {count} KV event messages arrived"
        frames = await sub.recv_multipart()
        assert len(frames) == 3 and len(frames[1]) == 8
        out.append((frames[0], int.from_bytes(frames[1], "big"), msgspec.msgpack.decode(frames[2])))
    return out


async def nothing_more(sub: zmq.asyncio.Socket) -> bool:
    return not await sub.poll(100)


def chain(server: MockEngineServer, prompt: Sequence[int]) -> list[int]:
    assert server.engine is not None
    return server.engine.cache.hasher.chain(prompt, BS)


PROMPT = list(range(100, 114))  # 14 tokens: three full blocks


class TestPublish:
    async def test_vllm_map_form_from_sequence_zero(self) -> None:
        async with engine_with_events("vllm") as server:
            assert server.kv_events_endpoint is not None
            async with kv_subscriber(server.kv_events_endpoint) as sub:
                await generate(server, "a", PROMPT)
                await generate(server, "b", PROMPT[:8] + [7, 7, 7, 7, 7])
                (t0, s0, p0), (t1, s1, p1) = await receive(sub, 2)
                assert await nothing_more(sub)
        hashes = chain(server, PROMPT)
        assert (t0, s0, t1, s1) == (b"", 0, b"", 1)
        ts, events, rank = p0
        assert isinstance(ts, float) and rank == 0
        assert (
            events
            == [  # one message per step: three blocks in one event
                {
                    "type": "BlockStored",
                    "block_hashes": hashes,
                    "parent_block_hash": None,
                    "token_ids": PROMPT[:12],
                    "block_size": BS,
                    "lora_id": None,
                    "medium": "GPU",
                    # vLLM 0.32's further keys (tests/fixtures/vllm_real.json)
                    "lora_name": None,
                    "extra_keys": [None, None, None],
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                }
            ]
        )
        (event,) = p1[1]
        assert event["parent_block_hash"] == hashes[1]  # the cached prefix is not stored again
        assert event["block_hashes"] == chain(server, PROMPT[:8] + [7, 7, 7, 7])[2:]
        assert all(isinstance(h, int) and 0 <= h < 1 << 64 for h in hashes)

    async def test_array_form_with_hash_bytes_and_topic(self) -> None:
        async with engine_with_events(
            "vllm", kv_events_format="array", kv_hash_form="bytes", kv_events_topic="kv@mock"
        ) as server:
            assert server.kv_events_endpoint is not None
            async with kv_subscriber(server.kv_events_endpoint, topic=b"kv@mock") as sub:
                await generate(server, "a", PROMPT)
                ((topic, seq, (ts, events, rank)),) = await receive(sub, 1)
        hashes = [h.to_bytes(8, "big") for h in chain(server, PROMPT)]
        assert (topic, seq, rank) == (b"kv@mock", 0, 0)
        assert events == [["BlockStored", hashes, None, PROMPT[:12], BS, None, "GPU"]]

    async def test_sglang_starts_with_all_blocks_cleared(self) -> None:
        async with engine_with_events("sglang") as server:
            assert server.kv_events_endpoint and server.kv_replay_endpoint
            async with kv_subscriber(server.kv_events_endpoint) as sub:
                await generate(server, "a", PROMPT)
                ((_, seq, (_, events, _)),) = await receive(sub, 1)
            replies = await kv_replay(server.kv_replay_endpoint, 0)
        assert seq == 1 and events[0]["type"] == "BlockStored"
        first = replies[0]
        assert first[1] == (0).to_bytes(8, "big")
        assert msgspec.msgpack.decode(first[2])[1] == [{"type": "AllBlocksCleared"}]

    async def test_sglang_repeated_prompt_stores_nothing_new(self) -> None:
        prompt = PROMPT[:12]  # a multiple of the block size: its last block is recomputed
        async with engine_with_events("sglang") as server:
            assert server.kv_events_endpoint is not None
            async with kv_subscriber(server.kv_events_endpoint) as sub:
                await generate(server, "a", prompt)
                await receive(sub, 1)
                await generate(server, "b", prompt)
                assert await nothing_more(sub)

    async def test_vllm_repeated_prompt_stores_its_last_block_again(self) -> None:
        prompt = PROMPT[:12]
        async with engine_with_events("vllm") as server:
            assert server.kv_events_endpoint is not None
            async with kv_subscriber(server.kv_events_endpoint) as sub:
                await generate(server, "a", prompt)
                await generate(server, "b", prompt)
                _, (_, seq, (_, events, _)) = await receive(sub, 2)
        hashes = chain(server, prompt)
        assert seq == 1
        assert [(e["block_hashes"], e["parent_block_hash"]) for e in events] == [
            ([hashes[2]], hashes[1])
        ]
        assert events[0]["token_ids"] == prompt[8:12]

    async def test_eviction_is_published(self) -> None:
        async with engine_with_events("sglang", num_blocks=3) as server:
            assert server.kv_events_endpoint is not None
            async with kv_subscriber(server.kv_events_endpoint) as sub:
                await generate(server, "a", PROMPT)
                await generate(server, "b", [9] * 5)
                _, (_, _, (_, events, _)) = await receive(sub, 2)
        assert [e["type"] for e in events] == ["BlockRemoved", "BlockStored"]
        assert events[0]["block_hashes"] == [chain(server, PROMPT)[2]]  # the chain's leaf


class TestReplay:
    async def fill(self, server: MockEngineServer, batches: int) -> None:
        for i in range(batches):
            await generate(server, f"r{i}", [1000 + i] * 5)

    @pytest.mark.parametrize("topic_frame", [False, True])
    async def test_from_the_middle_with_end_marker(self, topic_frame: bool) -> None:
        async with engine_with_events(
            "vllm", kv_replay_topic_frame=topic_frame, kv_events_topic="t"
        ) as server:
            await self.fill(server, 5)
            assert server.kv_replay_endpoint is not None and server.kv_events is not None
            replies = await kv_replay(server.kv_replay_endpoint, 2)
            buffered = dict(server.kv_events.replay(0))
        *batches, end = replies
        width = 4 if topic_frame else 3
        assert all(len(r) == width and r[0] == b"" for r in replies)
        if topic_frame:
            assert all(r[1] == b"t" for r in replies)
        assert [int.from_bytes(r[-2], "big") for r in batches] == [2, 3, 4]
        assert [r[-1] for r in batches] == [buffered[2], buffered[3], buffered[4]]
        assert end[-2] == END_SEQ and end[-1] == b""

    async def test_start_past_the_end_gets_only_the_marker(self) -> None:
        async with engine_with_events("vllm") as server:
            await self.fill(server, 2)
            assert server.kv_replay_endpoint is not None
            replies = await kv_replay(server.kv_replay_endpoint, 50)
        assert replies == [[b"", END_SEQ, b""]]

    async def test_malformed_request_is_ignored(self) -> None:
        async with engine_with_events("vllm") as server:
            await self.fill(server, 1)
            assert server.kv_replay_endpoint is not None
            ctx = zmq.asyncio.Context()
            dealer = ctx.socket(zmq.DEALER)
            try:
                dealer.connect(server.kv_replay_endpoint)
                await dealer.send_multipart([b"", b"\x01"])  # not 8 bytes
                assert not await dealer.poll(200)
            finally:
                dealer.close(linger=0)
                ctx.term()
            assert len(await kv_replay(server.kv_replay_endpoint, 0)) == 2  # still serving

    async def test_buffer_size(self) -> None:
        async with engine_with_events("vllm", kv_replay_buffer=2) as server:
            await self.fill(server, 4)
            assert server.kv_replay_endpoint is not None
            replies = await kv_replay(server.kv_replay_endpoint, 0)
        assert [int.from_bytes(r[1], "big") for r in replies[:-1]] == [2, 3]


class TestSkipSeq:
    async def test_skipped_batches_are_a_gap_on_pub_but_replayable(self) -> None:
        async with engine_with_events("vllm", kv_skip_seqs="1,2") as server:
            assert server.kv_events_endpoint and server.kv_replay_endpoint
            async with kv_subscriber(server.kv_events_endpoint) as sub:
                for i in range(4):
                    await generate(server, f"s{i}", [2000 + i] * 5)
                live = await receive(sub, 2)
                assert await nothing_more(sub)
            replies = await kv_replay(server.kv_replay_endpoint, 1)
        assert [seq for _, seq, _ in live] == [0, 3]
        assert [int.from_bytes(r[1], "big") for r in replies[:-1]] == [1, 2, 3]
        assert msgspec.msgpack.decode(replies[2][2]) == live[1][2]


class TestSockets:
    async def test_no_endpoint_no_sockets(self) -> None:
        async with start_mock_engine(MockEngineConfig(protocol="vllm", port=0)) as server:
            assert server.kv_events_endpoint is None and server.kv_replay_endpoint is None

    async def test_endpoint_in_use_fails_the_start(self) -> None:
        async with engine_with_events("vllm") as server:
            assert server.kv_events_endpoint is not None
            taken = server.kv_events_endpoint.replace("127.0.0.1", "*")  # a bind: fails
            config = MockEngineConfig(protocol="vllm", port=0, kv_events_endpoint=taken)
            with pytest.raises(OSError):
                async with start_mock_engine(config):
                    pass


class TestConnect:
    """Engines connect their PUB when the endpoint names a host: the subscriber binds."""

    @pytest.mark.parametrize("protocol", ["sglang", "vllm"])
    async def test_named_host_connects_to_a_bound_sub(self, protocol: str) -> None:
        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.bind("tcp://127.0.0.1:*")
            where = sub.getsockopt_string(zmq.LAST_ENDPOINT)
            async with engine_with_events(
                protocol, kv_events_endpoint=where, kv_events_topic="kv@me"
            ) as server:
                assert server._zmq is not None and server._zmq.connects
                frames: list[bytes] = []
                for n in range(50):  # the subscription reaches the PUB after it connects
                    await generate(server, f"r{n}", [7000 + n] * 8)
                    if await sub.poll(100):
                        frames = await sub.recv_multipart()
                        break
                assert frames and frames[0] == b"kv@me"
        finally:
            sub.close(linger=0)
            ctx.term()

    def test_the_engines_rule(self) -> None:
        from switchyard.mock_engine.kv_zmq import publisher_binds, rank_endpoint

        assert publisher_binds("tcp://*:5557") and publisher_binds("tcp://[::]:5557")
        assert publisher_binds("ipc:///tmp/kv") and publisher_binds("inproc://kv")
        assert not publisher_binds("tcp://router:5557")
        assert not publisher_binds("tcp://0.0.0.0:5557")  # both engines connect to it
        # port 0: nothing to connect to; the mock binds a free port (its port-0 convention)
        assert publisher_binds("tcp://127.0.0.1:0") and publisher_binds("tcp://127.0.0.1:*")
        assert rank_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
        assert rank_endpoint("tcp://127.0.0.1:*", 2) == "tcp://127.0.0.1:*"
