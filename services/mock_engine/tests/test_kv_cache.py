"""The simulated prefix cache: engine hashes, prefix reuse, pinning, LRU leaf-first eviction,
the two engine families' policies, and the events each operation yields."""

from __future__ import annotations

import pytest
import xxhash

from switchyard.mock_engine.kv_cache import (
    SGLANG_POLICY,
    VLLM_POLICY,
    CachePolicy,
    EngineHasher,
    Lease,
    PrefixCache,
)
from switchyard.mock_engine.types import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

BS = 4


def make_cache(num_blocks: int = 16, policy: CachePolicy = SGLANG_POLICY) -> PrefixCache:
    return PrefixCache(block_size=BS, num_blocks=num_blocks, hasher=EngineHasher(11), policy=policy)


def run(cache: PrefixCache, prompt: list[int]) -> tuple[Lease, list[KvEvent]]:
    """A request that prefilled `prompt` and is still running (its blocks pinned)."""
    lease = cache.begin(prompt)
    return lease, cache.commit(lease, prompt, len(prompt))


def finish(cache: PrefixCache, prompt: list[int]) -> list[KvEvent]:
    lease, events = run(cache, prompt)
    cache.release(lease)
    return events


def stored_hashes(events: list[KvEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


def removed_hashes(events: list[KvEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


class TestEngineHash:
    def test_u64_chained_and_seeded(self) -> None:
        hasher = EngineHasher(11)
        a, b = hasher.chain(seq(100, 8), BS)
        assert a == hasher.block(None, seq(100, 4))
        assert b == hasher.block(a, seq(104, 4))
        assert b != hasher.block(None, seq(104, 4))  # the parent is part of the id
        assert EngineHasher(12).chain(seq(100, 8), BS) != [a, b]  # per-engine seed
        assert all(0 <= h < 1 << 64 for h in (a, b))

    def test_not_the_router_hash_and_often_above_2_63(self) -> None:
        hasher = EngineHasher(0)
        ids = [hasher.block(None, [t, t + 1, t + 2, t + 3]) for t in range(200)]
        assert any(h >= 1 << 63 for h in ids)
        router = xxhash.xxh3_64_intdigest(
            b"".join(t.to_bytes(4, "little") for t in range(4)), seed=1337
        )
        assert ids[0] != router

    def test_partial_block_is_not_hashed(self) -> None:
        assert len(EngineHasher(1).chain(seq(0, 11), BS)) == 2

    def test_bad_seed(self) -> None:
        with pytest.raises(ValueError):
            EngineHasher(1 << 64)


class TestPrefixReuse:
    def test_first_request_stores_its_full_blocks(self) -> None:
        cache = make_cache()
        lease, events = run(cache, seq(100, 10))
        assert lease.cached_tokens == 0
        assert len(events) == 1 and isinstance(events[0], BlockStored)
        stored = events[0]
        assert stored.block_hashes == tuple(cache.hasher.chain(seq(100, 10), BS))
        assert stored.parent_block_hash is None
        assert stored.token_ids == tuple(seq(100, 8)) and stored.block_size == BS
        assert cache.cached_blocks == 2 and cache.pinned_blocks == 2

    def test_shared_prefix_is_cached(self) -> None:
        cache = make_cache()
        finish(cache, seq(100, 10))
        lease, events = run(cache, seq(100, 8) + seq(500, 6))
        assert lease.cached_tokens == 8
        assert len(events) == 1 and isinstance(events[0], BlockStored)
        assert events[0].parent_block_hash == cache.hasher.chain(seq(100, 8), BS)[1]
        assert events[0].token_ids == tuple(seq(500, 4))

    def test_match_stops_at_first_miss(self) -> None:
        cache = make_cache()
        finish(cache, seq(100, 12))
        prompt = seq(100, 4) + [9] + seq(105, 8)  # block 1 differs: blocks 1 and 2 miss
        assert cache.begin(prompt).cached_tokens == 4

    def test_last_prompt_token_is_always_computed(self) -> None:
        cache = make_cache()
        finish(cache, seq(100, 8))
        assert cache.match_tokens(seq(100, 8)) == 4  # block 1 holds the last token
        assert cache.match_tokens(seq(100, 9)) == 8

    def test_sglang_repeat_stores_nothing(self) -> None:
        cache = make_cache(policy=SGLANG_POLICY)
        finish(cache, seq(100, 8))
        lease, events = run(cache, seq(100, 8))
        assert lease.cached_tokens == 4 and events == []
        assert lease.held == 2  # the recomputed block is reused and pinned

    def test_vllm_repeat_stores_its_last_block_again(self) -> None:
        cache = make_cache(policy=VLLM_POLICY)
        first = finish(cache, seq(100, 8))
        lease, events = run(cache, seq(100, 8))
        h0, h1 = stored_hashes(first)
        assert events == [BlockStored((h1,), h0, tuple(seq(104, 4)), BS)]
        assert cache.copies(h1) == 2 and cache.used_blocks == 3
        cache.release(lease)
        _, third = run(cache, seq(100, 8))
        assert third == []  # at most two copies

    def test_hit_rate(self) -> None:
        cache = make_cache()
        finish(cache, seq(100, 9))
        finish(cache, seq(100, 9))
        assert cache.hit_rate == pytest.approx(8 / 18)


class TestOutputBlocks:
    def test_commit_extends_the_chain_as_tokens_are_computed(self) -> None:
        cache = make_cache()
        tokens = seq(100, 6)
        lease, _ = run(cache, tokens)
        tokens += [7, 8]
        assert cache.commit(lease, tokens, len(tokens) - 1) == []  # 7 computed: still one block
        tokens.append(9)
        events = cache.commit(lease, tokens, len(tokens) - 1)
        chain = cache.hasher.chain(tokens, BS)
        assert events == [BlockStored((chain[1],), chain[0], (104, 105, 7, 8), BS)]


class TestEviction:
    def test_lru_leaves_first(self) -> None:
        cache = make_cache(num_blocks=4)
        a = stored_hashes(finish(cache, seq(100, 8)))
        b = stored_hashes(finish(cache, seq(200, 8)))
        finish(cache, seq(100, 9))  # touches a: b is now the least recently used
        events = finish(cache, seq(300, 4))
        assert removed_hashes(events) == [b[1]]  # b's leaf, not its root
        events = finish(cache, seq(400, 4))
        assert removed_hashes(events) == [b[0]]  # then b's root, now a leaf
        assert all(h in cache for h in a)

    def test_removal_comes_before_the_store_it_made_room_for(self) -> None:
        cache = make_cache(num_blocks=2)
        finish(cache, seq(100, 8))
        events = finish(cache, seq(200, 4))
        assert [type(e) for e in events] == [BlockRemoved, BlockStored]

    def test_never_orphans_a_cached_child(self) -> None:
        cache = make_cache(num_blocks=2)
        root, child = stored_hashes(finish(cache, seq(100, 8)))
        finish(cache, seq(100, 5))  # touches the root only: it is newer than its child
        events = finish(cache, seq(200, 8))
        assert removed_hashes(events) == [child, root]

    def test_pinned_blocks_are_not_evicted(self) -> None:
        cache = make_cache(num_blocks=2)
        held, _ = run(cache, seq(100, 8))
        lease, events = run(cache, seq(200, 8))
        assert events == [] and lease.stopped  # no room: nothing stored, the request runs on
        assert cache.refs(held.hashes[0]) == 1 and cache.used_blocks == 2
        cache.release(lease)
        cache.release(held)
        assert cache.pinned_blocks == 0
        assert removed_hashes(finish(cache, seq(200, 4))) == [held.hashes[1]]

    def test_partial_store_when_room_runs_out(self) -> None:
        cache = make_cache(num_blocks=3)
        run(cache, seq(100, 8))  # pins two
        lease, events = run(cache, seq(200, 12))
        assert stored_hashes(events) == lease.hashes[:1] and lease.stopped

    def test_copies_go_one_at_a_time(self) -> None:
        cache = make_cache(num_blocks=3, policy=VLLM_POLICY)
        h0, h1 = stored_hashes(finish(cache, seq(100, 8)))
        finish(cache, seq(100, 8))  # a second copy of h1
        events = finish(cache, seq(200, 4))
        assert removed_hashes(events) == [h1] and cache.copies(h1) == 1
        events = finish(cache, seq(300, 4))
        assert removed_hashes(events) == [h1] and h1 not in cache

    def test_clear_refused_while_pinned(self) -> None:
        cache = make_cache()
        lease, _ = run(cache, seq(100, 8))
        assert cache.clear() is None
        cache.release(lease)
        assert cache.clear() == [AllBlocksCleared()]
        assert cache.cached_blocks == 0 and cache.used_blocks == 0

    def test_many_requests_keep_the_accounting(self) -> None:
        cache = make_cache(num_blocks=8, policy=VLLM_POLICY)
        live: set[int] = set()
        for i in range(300):
            prompt = seq(1000 * (i % 7), 4 + 4 * (i % 5)) + [i % 3]
            for event in finish(cache, prompt):
                if isinstance(event, BlockStored):
                    if event.parent_block_hash is not None:
                        assert event.parent_block_hash in live  # every chain stays rooted
                    live.update(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    for h in event.block_hashes:
                        if cache.copies(h) == 0:
                            live.discard(h)
            assert cache.used_blocks <= 8 and cache.pinned_blocks == 0
        assert live == {h for h in live if h in cache}


class TestHold:
    def test_hold_pins_every_full_block_until_released(self) -> None:
        cache = make_cache()
        prompt = seq(100, 8)  # two full blocks: `begin` would match only the first
        finish(cache, prompt)
        assert cache.pinned_blocks == 0
        lease = cache.hold(prompt)
        assert (lease.held, lease.cached_tokens, cache.pinned_blocks) == (2, 8, 2)
        assert cache.hit_rate == 0.0  # no statistics for a hold
        cache.release(lease)
        assert cache.pinned_blocks == 0

    def test_hold_stops_at_the_first_miss(self) -> None:
        cache = make_cache()
        finish(cache, seq(100, 5))
        lease = cache.hold(seq(100, 12))
        assert lease.held == 1 and cache.pinned_blocks == 1
        cache.release(lease)
