"""The router's KV ingestion against the engines' own publisher code (issue 32).

Each engine here is a simulated KV cache (the mock engine's PrefixCache under the family's
policy: vLLM stores a recomputed block again as a second copy, SGLang does not; evicts least
recently used leaves; 64-bit engine hashes, about half of them >= 2^63) whose events go out
through the engine's real `ZmqEventPublisher` (vLLM 0.33.0, SGLang 0.5.23:
tests/kv_publishers), threads, sockets, sequence numbers, replay ROUTER and all. The router
side is the router's KV ingestion (KvIngestor, KvIndex) on real ZMQ.

Every case is exact: once the events have arrived, the router's overlap for every prompt
equals the prefix the engine holds (`Engine.cached`), on every worker.
"""

from __future__ import annotations

import asyncio
import atexit
import random
import socket
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from kv_publishers.load import sglang_kv_events, vllm_kv_events

from switchyard.common.block_hash import block_hashes
from switchyard.common.ports import free_port
from switchyard.mock_engine import types as mock
from switchyard.mock_engine.kv_cache import (
    SGLANG_POLICY,
    VLLM_POLICY,
    EngineHasher,
    PrefixCache,
)
from switchyard.protos.messages import Instance, InstanceAdded, InstanceRemoved
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.ingestor import KvIngestor, ListenerSpec  # noqa: F401

BS = 4
FAMILIES = ("vllm", "sglang")
DEADLINE = 15.0


async def until(predicate: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def wait_free(endpoint: str) -> None:
    """Until a just-closed ZMQ socket (closed in ZMQ's I/O thread) has let its port go."""
    host, _, port = endpoint.partition("://")[2].rpartition(":")
    if host in ("*", "0.0.0.0"):
        host = "0.0.0.0"
    elif host != "127.0.0.1":
        return  # connects: nothing to bind
    for _ in range(200):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, int(port)))
                return
            except OSError:
                time.sleep(0.02)


class Engine:
    """One engine rank: its cache, and its real publisher at `endpoint` / `replay`."""

    def __init__(
        self,
        family: str,
        *,
        endpoint: str,
        replay: str,
        topic: str = "",
        num_blocks: int = 256,
        seed: int = 0x9E3779B97F4A7C15,
    ) -> None:
        self.family = family
        self.module = vllm_kv_events() if family == "vllm" else sglang_kv_events()
        self.endpoint, self.replay, self.topic = endpoint, replay, topic
        self.num_blocks, self.seed = num_blocks, seed
        self.publisher: Any = None
        self.published = 0
        self.cache = self._cache()

    def _cache(self) -> PrefixCache:
        policy = VLLM_POLICY if self.family == "vllm" else SGLANG_POLICY
        return PrefixCache(
            block_size=BS, num_blocks=self.num_blocks, hasher=EngineHasher(self.seed), policy=policy
        )

    def start(self) -> None:
        """The publisher binds (or connects) as the engine's own code decides."""
        rank = {"data_parallel_rank" if self.family == "vllm" else "attn_dp_rank": 0}
        for endpoint in (self.endpoint, self.replay):
            wait_free(endpoint)  # a restart waits for its ports, as a new process would
        self.publisher = self.module.ZmqEventPublisher(
            **rank, endpoint=self.endpoint, replay_endpoint=self.replay, topic=self.topic
        )
        self.published = 0
        if self.family == "sglang":
            self.publish([mock.AllBlocksCleared()])  # SGLang's sequence 0 at start

    def restart(self) -> None:
        """The engine process restarts: an empty cache, a new publisher from sequence 0."""
        self.stop()
        self.cache = self._cache()
        self.start()

    def stop(self) -> None:
        if self.publisher is not None:
            self.publisher.shutdown()
            atexit.unregister(self.publisher.shutdown)  # SGLang's registers itself
            self.publisher = None

    def publish(self, events: list[mock.KvEvent]) -> None:
        m = self.module
        converted: list[Any] = []
        for event in events:
            if isinstance(event, mock.BlockStored):
                fields: dict[str, Any] = {
                    "block_hashes": list(event.block_hashes),
                    "parent_block_hash": event.parent_block_hash,
                    "token_ids": list(event.token_ids),
                    "block_size": event.block_size,
                    "lora_id": None,
                    "medium": "GPU",
                }
                if self.family == "vllm":
                    fields["lora_name"] = None
                converted.append(m.BlockStored(**fields))
            elif isinstance(event, mock.BlockRemoved):
                converted.append(
                    m.BlockRemoved(block_hashes=list(event.block_hashes), medium="GPU")
                )
            else:
                converted.append(m.AllBlocksCleared())
        self.publisher.publish(m.KVEventBatch(ts=time.time(), events=converted))
        self.published += 1

    def serve(self, prompt: list[int], output: list[int]) -> None:
        """One request: match, compute prompt and output, store, release."""
        lease = self.cache.begin(prompt)
        tokens = prompt + output
        events = self.cache.commit(lease, tokens, len(tokens))
        if events:
            self.publish(events)
        self.cache.release(lease)

    def cached(self, prompt: list[int]) -> int:
        """Leading full blocks of `prompt` the engine holds."""
        held = 0
        for block_hash in self.cache.hasher.chain(prompt, BS):
            if block_hash not in self.cache:
                break
            held += 1
        return held

    def big_hashes(self) -> int:
        return sum(1 for h in self.cache._blocks if h >= 1 << 63)


def conversations(rng: random.Random, count: int, turns: int) -> list[list[list[int]]]:
    """Multi-turn chats over one shared system prompt: each turn's prompt extends the last."""
    system = [rng.randrange(1, 50_000) for _ in range(10)]
    chats = []
    for _ in range(count):
        history = list(system)
        prompts = []
        for _ in range(turns):
            history += [rng.randrange(1, 50_000) for _ in range(rng.randrange(3, 15))]
            prompts.append(list(history))
            history += [rng.randrange(1, 50_000) for _ in range(rng.randrange(2, 9))]
        chats.append(prompts)
    return chats


class Router:
    def __init__(self, ingestor: KvIngestor) -> None:
        self.ingestor = ingestor
        self.index = ingestor.index

    def overlap(self, prompt: list[int], worker: tuple[int, int] = (1, 0)) -> int:
        return self.index.overlaps(block_hashes(prompt, BS)).get(worker, 0)


async def exact(router: Router, engine: Engine, prompts: list[list[int]], iid: int = 1) -> None:
    """Router overlap == engine cache for every prompt (once the events have arrived)."""

    def mismatches() -> list[tuple[int, int]]:
        return [
            (engine.cached(p), router.overlap(p, (iid, 0)))
            for p in prompts
            if engine.cached(p) != router.overlap(p, (iid, 0))
        ]

    try:
        await until(lambda: not mismatches(), "router overlap == engine cache")
    except AssertionError:
        bad = mismatches()
        raise AssertionError(
            f"{len(bad)} of {len(prompts)} prompts differ (engine, router): {bad[:8]}; "
            f"counters {router.index.counters}"
        ) from None
    assert any(engine.cached(p) for p in prompts), "the case cached nothing"


def instance(engine: Engine, *, endpoint: str | None, iid: int = 1) -> Instance:
    return Instance(
        instance_id=iid,
        url=f"grpc://127.0.0.1:{40000 + iid}",
        protocol=engine.family,
        model="m",
        context_length=4096,
        block_size=BS,
        kv_events_endpoint=endpoint,
        kv_replay_endpoint=engine.replay.replace("*", "127.0.0.1"),
    )


@pytest.fixture
async def world():
    """Engines and router ingestors made by a test, all stopped at teardown."""
    ctx = zmq.asyncio.Context()
    engines: list[Engine] = []
    routers: list[KvIngestor] = []

    def engine(family: str, *, connect_to: str | None = None, **kw: Any) -> Engine:
        pub, replay = free_port(), free_port()
        if connect_to is not None:
            endpoint = connect_to  # a named host: the engine's code connects
        elif family == "vllm":
            endpoint = f"tcp://*:{pub}"  # vLLM binds for a wildcard host only
        else:
            endpoint = f"tcp://0.0.0.0:{pub}"  # SGLang binds for 0.0.0.0 too
        made = Engine(family, endpoint=endpoint, replay=f"tcp://127.0.0.1:{replay}", **kw)
        made.pub_port = pub  # type: ignore[attr-defined]
        engines.append(made)
        return made

    async def router(listener: ListenerSpec | None = None) -> Router:
        ingestor = KvIngestor(KvIndex(), context=ctx, open_client=None, listener=listener)
        await ingestor.start()
        routers.append(ingestor)
        return Router(ingestor)

    yield engine, router
    for made in engines:
        made.stop()
    for ingestor in routers:
        await ingestor.close()
    ctx.term()


def bound_endpoint(engine: Engine) -> str:
    return f"tcp://127.0.0.1:{engine.pub_port}"  # type: ignore[attr-defined]


async def serve_all(engine: Engine, prompts: list[list[int]], rng: random.Random) -> None:
    for prompt in prompts:
        engine.serve(prompt, [rng.randrange(1, 50_000) for _ in range(rng.randrange(1, 9))])
        await asyncio.sleep(0)


@pytest.mark.parametrize("family", FAMILIES)
class TestRealPublishers:
    async def test_bind(self, world, family):
        make_engine, make_router = world
        rng = random.Random(1)
        engine = make_engine(family)
        engine.start()
        router = await make_router()
        router.ingestor.apply_events(
            [InstanceAdded(instance(engine, endpoint=bound_endpoint(engine)))]
        )
        await until(lambda: router.ingestor.streams(1)[0].stats.connected, "subscribed")
        prompts = [p for chat in conversations(rng, 6, 4) for p in chat]
        await serve_all(engine, prompts, rng)
        await exact(router, engine, prompts)
        assert engine.big_hashes() > 0  # hashes >= 2^63 went over the wire

    async def test_late_bind(self, world, family):
        """The router subscribes before the engine's publisher binds; the engine publishes
        one burst and goes idle."""
        make_engine, make_router = world
        rng = random.Random(2)
        engine = make_engine(family)
        router = await make_router()
        router.ingestor.apply_events(
            [InstanceAdded(instance(engine, endpoint=bound_endpoint(engine)))]
        )
        # Long enough for the SUB to back off to its longest retry interval, and past the
        # 2 s catch-up window after which the router used to give up for good.
        await asyncio.sleep(6.0)
        engine.start()
        bound_at = time.monotonic()
        prompts = [p for chat in conversations(rng, 3, 2) for p in chat]
        await serve_all(engine, prompts, rng)  # at once: before the SUB is connected
        await exact(router, engine, prompts)
        print(f"{family}: late bind indexed {time.monotonic() - bound_at:.2f} s after binding")

    async def test_restart(self, world, family):
        make_engine, make_router = world
        rng = random.Random(3)
        engine = make_engine(family)
        engine.start()
        router = await make_router()
        router.ingestor.apply_events(
            [InstanceAdded(instance(engine, endpoint=bound_endpoint(engine)))]
        )
        await until(lambda: router.ingestor.streams(1)[0].stats.connected, "subscribed")
        before = [p for chat in conversations(rng, 4, 3) for p in chat]
        await serve_all(engine, before, rng)
        await exact(router, engine, before)
        engine.restart()  # fewer batches in its new life than the router has applied
        after = [p for chat in conversations(rng, 1, 2) for p in chat]
        await serve_all(engine, after, rng)
        await exact(router, engine, before + after)
        assert all(router.overlap(p) == 0 for p in before if not engine.cached(p))

    async def test_gap(self, world, family):
        """A live batch lost on the way (the PUB socket drops it): the next one shows the gap
        and the router replays it from the engine."""
        make_engine, make_router = world
        rng = random.Random(4)
        engine = make_engine(family)
        engine.start()
        router = await make_router()
        router.ingestor.apply_events(
            [InstanceAdded(instance(engine, endpoint=bound_endpoint(engine)))]
        )
        await until(lambda: router.ingestor.streams(1)[0].stats.connected, "subscribed")
        chats = conversations(rng, 4, 3)
        first = [p for chat in chats[:2] for p in chat]
        await serve_all(engine, first, rng)
        await exact(router, engine, first)
        lose_next_send(engine)
        rest = [p for chat in chats[2:] for p in chat]
        await serve_all(engine, rest, rng)
        await exact(router, engine, first + rest)
        assert router.index.counters.gaps >= 1

    async def test_lru_eviction(self, world, family):
        make_engine, make_router = world
        rng = random.Random(5)
        engine = make_engine(family, num_blocks=40)  # far fewer than the prompts need
        engine.start()
        router = await make_router()
        router.ingestor.apply_events(
            [InstanceAdded(instance(engine, endpoint=bound_endpoint(engine)))]
        )
        await until(lambda: router.ingestor.streams(1)[0].stats.connected, "subscribed")
        prompts = [p for chat in conversations(rng, 8, 4) for p in chat]
        await serve_all(engine, prompts, rng)
        await exact(router, engine, prompts)
        assert router.index.size((1, 0)) == engine.cache.cached_blocks <= 40

    async def test_duplicate_stores(self, world, family):
        """Block-aligned prompts served again: vLLM stores the recomputed last block a second
        time (a copy) and removes each copy with its own BlockRemoved; SGLang stores
        nothing new. Evictions then take the copies."""
        make_engine, make_router = world
        rng = random.Random(6)
        engine = make_engine(family, num_blocks=48)
        engine.start()
        router = await make_router()
        router.ingestor.apply_events(
            [InstanceAdded(instance(engine, endpoint=bound_endpoint(engine)))]
        )
        await until(lambda: router.ingestor.streams(1)[0].stats.connected, "subscribed")
        aligned = [[rng.randrange(1, 50_000) for _ in range(BS * n)] for n in (3, 4, 5, 6)]
        for _ in range(3):
            await serve_all(engine, aligned, rng)
        await exact(router, engine, aligned)
        if family == "vllm":
            assert router.index.counters.duplicate_stores > 0
        others = [p for chat in conversations(rng, 6, 3) for p in chat]
        await serve_all(engine, others, rng)  # evicts copies and blocks
        await exact(router, engine, aligned + others)

    @pytest.mark.parametrize("topics", ["named", "default"])
    async def test_connect_mode(self, world, family, topics):
        """The engine's endpoint names a host, so its own code connects the PUB there. The
        router learns that from the instance (`kv_events_bind`, which fleet derives from
        SGLang's report or the worker option), binds that endpoint, no flag needed, and tells
        the engines apart by their topics (or, with the engines' default topic "", by host:
        one engine here)."""
        make_engine, make_router = world
        rng = random.Random(7)
        listen = f"tcp://127.0.0.1:{free_port()}"
        router = await make_router()
        ids = (1, 2) if topics == "named" else (1,)
        engines = {}
        for iid in ids:
            topic = f"engine-{iid}" if topics == "named" else ""
            engines[iid] = make_engine(family, connect_to=listen, topic=topic)
            routed = instance(engines[iid], endpoint=None, iid=iid)
            routed = msgspec.structs.replace(routed, kv_events_bind=listen, kv_topic=topic)
            router.ingestor.apply_events([InstanceAdded(routed)])
        for engine in engines.values():
            engine.start()
        chats = conversations(rng, 6, 3)
        prompts = {iid: [p for chat in chats[iid - 1 :: len(ids)] for p in chat] for iid in ids}
        everything = [p for iid in ids for p in prompts[iid]]
        for iid, engine in engines.items():
            await serve_all(engine, prompts[iid], rng)
        for iid, engine in engines.items():
            await exact(router, engine, everything, iid=iid)
        last = engines[ids[-1]]
        last.restart()
        more = [p for chat in conversations(rng, 2, 2) for p in chat]
        await serve_all(last, more, rng)
        await exact(router, last, everything + more, iid=ids[-1])
        router.ingestor.apply_events([InstanceRemoved(1, "grpc://127.0.0.1:40001")])


def lose_next_send(engine: Engine) -> None:
    """The engine's next live message never reaches the subscriber (it stays in the replay
    buffer, as a message lost on the network would)."""
    pub = engine.publisher._pub

    class Lossy:
        lost = False

        def __getattr__(self, name: str) -> Any:
            return getattr(pub, name)

        def send_multipart(self, frames: Any, *args: Any, **kwargs: Any) -> Any:
            if not Lossy.lost:
                Lossy.lost = True
                return None
            return pub.send_multipart(frames, *args, **kwargs)

    engine.publisher._pub = Lossy()
