import random

import msgspec
import pytest

from switchyard.common.block_hash import block_hashes
from switchyard.router.kv.index import OFFLOADED, KvIndex
from switchyard.router.kv.types import CLEARED, Removed, Stored

BS = 4
PROMPT = list(range(100, 132))  # 8 blocks of 4
OWN = block_hashes(PROMPT, BS)


def store(hashes, parent, tokens, block_size=BS, **kw):
    return Stored(hashes, parent, tokens, block_size, **kw)


W1, W2 = (1, 0), (2, 0)


def chain(index: KvIndex, worker: int, blocks: int, first_hash: int = 1000, per: int = 2):
    """Store the first `blocks` blocks of PROMPT on `worker` in events of `per` blocks."""
    parent = None
    for start in range(0, blocks, per):
        count = min(per, blocks - start)
        hashes = list(range(first_hash + start, first_hash + start + count))
        tokens = PROMPT[start * BS : (start + count) * BS]
        index.apply_batch(worker, [store(hashes, parent, tokens)])
        parent = hashes[-1]


class TestStore:
    def test_chain_keyed_by_router_hash(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        assert index.overlaps(OWN) == {(1, 0): 8}
        assert index.size((1, 0)) == 8
        assert len(index) == 8
        assert index.holders(OWN[3]) == {(1, 0)}

    def test_same_content_on_two_workers_shares_keys(self):
        index = KvIndex()
        chain(index, (1, 0), 8, first_hash=1)
        chain(index, (2, 0), 3, first_hash=2**64 - 100)  # other engine hashes, same content
        assert index.overlaps(OWN) == {(1, 0): 8, (2, 0): 3}
        assert len(index) == 8

    def test_one_event_with_many_blocks(self):
        index = KvIndex()
        index.apply_batch((1, 0), [store(list(range(8)), None, PROMPT)])
        assert index.overlaps(OWN) == {(1, 0): 8}

    def test_block_size_inferred_when_missing(self):
        index = KvIndex()
        index.apply_batch((1, 0), [store([1, 2], None, PROMPT[:8], block_size=0)])
        assert index.overlaps(OWN) == {(1, 0): 2}

    def test_restore_is_a_second_copy(self):
        index = KvIndex()
        chain(index, (1, 0), 4)
        chain(index, (1, 0), 4)
        assert index.copies(W1, 1000) == 2
        index.apply_batch((1, 0), [Removed([1000, 1001, 1002, 1003])])
        assert index.overlaps(OWN) == {W1: 4}
        index.apply_batch((1, 0), [Removed([1000, 1001, 1002, 1003])])
        assert index.overlaps(OWN) == {}
        assert len(index) == 0

    def test_same_content_under_two_engine_hashes_needs_both_removed(self):
        index = KvIndex()
        index.apply_batch((1, 0), [store([1], None, PROMPT[:4]), store([2], None, PROMPT[:4])])
        assert index.size((1, 0)) == 1
        index.apply_batch((1, 0), [Removed([1])])
        assert index.overlaps(OWN) == {(1, 0): 1}
        index.apply_batch((1, 0), [Removed([2])])
        assert index.overlaps(OWN) == {}

    def test_engine_hash_reused_for_other_content(self):
        index = KvIndex()
        index.apply_batch((1, 0), [store([7], None, PROMPT[:4])])
        index.apply_batch((1, 0), [store([7], None, [9, 9, 9, 9])])
        assert index.overlaps(OWN) == {}
        assert index.overlaps(block_hashes([9, 9, 9, 9], BS)) == {(1, 0): 1}
        assert len(index) == 1


class TestUnknownParent:
    def test_skipped_and_counted(self):
        index = KvIndex()
        index.apply_batch((1, 0), [store([5], 999, PROMPT[4:8])])
        assert index.counters.unknown_parent == 1
        assert len(index) == 0
        assert index.size((1, 0)) == 0

    def test_parent_known_only_on_another_worker(self):
        index = KvIndex()
        chain(index, (1, 0), 2)
        index.apply_batch((2, 0), [store([5], 1001, PROMPT[8:12])])
        assert index.counters.unknown_parent == 1
        assert index.overlaps(OWN) == {(1, 0): 2}

    def test_parent_removed_before_child_stored(self):
        index = KvIndex()
        chain(index, (1, 0), 2)
        index.apply_batch((1, 0), [Removed([1001]), store([1002], 1001, PROMPT[8:12])])
        assert index.counters.unknown_parent == 1
        assert index.overlaps(OWN) == {(1, 0): 1}


class TestSkipped:
    def test_token_ids_not_covering_blocks(self):
        index = KvIndex()
        index.apply_batch((1, 0), [store([1, 2], None, PROMPT[:7])])
        assert index.counters.malformed_stored == 1
        assert len(index) == 0

    def test_token_ids_outside_u32(self):
        index = KvIndex()
        index.apply_batch((1, 0), [store([1], None, [-1, 2, 3, 4])])
        assert index.counters.malformed_stored == 1

    def test_remote_tier_and_namespaced_blocks(self):
        index = KvIndex()
        index.apply_batch(
            W1,
            [
                store([1], None, PROMPT[:4], medium="EXTERNAL"),
                store([2], None, PROMPT[:4], locality="REMOTE"),
                store([3], None, PROMPT[:4], lora_id=3),
                store([4], None, PROMPT[:4], lora_name="adapter"),
                store([5], None, PROMPT[:4], extra_keys=[["salt"]]),
                store([6], None, PROMPT[:4], ownership="kvcr"),
                Removed([1], medium="REMOTE"),
            ],
        )
        assert len(index) == 0
        assert index.counters.skipped_tier == 4
        assert index.counters.skipped_namespace == 3

    def test_extra_keys_without_keys_are_plain_blocks(self):
        index = KvIndex()
        index.apply_batch(W1, [store([1, 2], None, PROMPT[:8], extra_keys=[None, None])])
        assert index.overlaps(OWN) == {W1: 2}

    def test_empty_store_and_unknown_removal(self):
        index = KvIndex()
        index.apply_batch((1, 0), [store([], None, []), Removed([42])])
        assert len(index) == 0
        assert index.counters.events_applied == 2
        assert index.counters.batches_applied == 1


class TestRemove:
    def test_removes_worker_from_blocks(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        chain(index, (2, 0), 8, first_hash=5000)
        index.apply_batch((1, 0), [Removed([1006, 1007])])
        assert index.overlaps(OWN) == {(1, 0): 6, (2, 0): 8}
        assert index.size((1, 0)) == 6
        assert index.holders(OWN[7]) == {(2, 0)}

    def test_blocks_nobody_holds_are_dropped(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        index.apply_batch((1, 0), [Removed(list(range(1000, 1008)))])
        assert len(index) == 0
        assert index.size((1, 0)) == 0

    def test_removing_a_middle_block_cuts_the_prefix(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        index.apply_batch((1, 0), [Removed([1003])])
        assert index.overlaps(OWN) == {(1, 0): 3}


class TestClear:
    def test_all_blocks_cleared(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        chain(index, (2, 0), 4, first_hash=1)
        index.apply_batch((1, 0), [CLEARED])
        assert index.overlaps(OWN) == {(2, 0): 4}
        assert index.size((1, 0)) == 0
        assert len(index) == 4

    def test_clear_then_store_in_one_batch(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        index.apply_batch((1, 0), [CLEARED, store([1], None, PROMPT[:4])])
        assert index.overlaps(OWN) == {(1, 0): 1}

    def test_clear_worker(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        index.clear_worker((1, 0))
        index.clear_worker((99, 0))  # unknown: nothing
        assert len(index) == 0
        assert index.workers() == [(1, 0)]

    def test_parents_forgotten_after_clear(self):
        index = KvIndex()
        chain(index, (1, 0), 2)
        index.apply_batch((1, 0), [CLEARED, store([1002], 1001, PROMPT[8:12])])
        assert index.counters.unknown_parent == 1


class TestRemoveWorker:
    def test_remove_worker(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        chain(index, (2, 0), 8, first_hash=1)
        index.remove_worker((1, 0))
        index.remove_worker((1, 0))  # twice: nothing
        assert index.overlaps(OWN) == {(2, 0): 8}
        assert index.workers() == [(2, 0)]
        assert index.size((1, 0)) == 0

    def test_slot_reused_without_leaking_blocks(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        index.remove_worker((1, 0))
        chain(index, (3, 0), 2)  # takes worker 1's bit
        assert index.overlaps(OWN) == {(3, 0): 2}
        assert len(index) == 2


class TestOverlaps:
    def test_empty_request_and_empty_index(self):
        index = KvIndex()
        assert index.overlaps([]) == {}
        assert index.overlaps(OWN) == {}
        chain(index, (1, 0), 2)
        assert index.overlaps([]) == {}

    def test_stops_at_first_miss_per_worker(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        chain(index, (2, 0), 5, first_hash=1)
        chain(index, (3, 0), 2, first_hash=50)
        index.apply_batch((1, 0), [Removed([1001])])  # worker 1 misses block 1, holds 2..7
        assert index.overlaps(OWN) == {(1, 0): 1, (2, 0): 5, (3, 0): 2}

    def test_worker_without_the_first_block_is_absent(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        index.apply_batch((1, 0), [Removed([1000])])
        assert index.overlaps(OWN) == {}

    def test_request_longer_than_cached_prefix(self):
        index = KvIndex()
        chain(index, (1, 0), 3)
        longer = block_hashes(PROMPT + list(range(64)), BS)
        assert index.overlaps(longer) == {(1, 0): 3}

    def test_divergent_request(self):
        index = KvIndex()
        chain(index, (1, 0), 8)
        other = block_hashes(PROMPT[:12] + [0, 0, 0, 0] + PROMPT[16:], BS)
        assert index.overlaps(other) == {(1, 0): 3}

    def test_many_workers(self):
        index = KvIndex()
        for worker in range(100):
            chain(index, (worker, 0), worker % 9, first_hash=worker * 100)
        expected = {(w, 0): w % 9 for w in range(100) if w % 9}
        assert index.overlaps(OWN + [12345]) == {w: min(d, 8) for w, d in expected.items()}


class TestCopies:
    """vLLM re-stores the last block of an exact block-aligned repeat as a second physical
    block under the same hash and removes each copy with its own BlockRemoved: the first
    removal used to drop the block from the index while the engine still held the other."""

    def test_block_aligned_repeat_then_lru_eviction(self):
        index = KvIndex()
        # The first prompt: 2 blocks stored. The same prompt again: vLLM recomputes the last
        # block (one token must be computed) and stores it again under the same hash.
        index.apply_batch(W1, [store([11, 12], None, PROMPT[:8])])
        index.apply_batch(W1, [store([12], 11, PROMPT[4:8])])
        assert index.copies(W1, 12) == 2
        # LRU eviction takes one copy of the leaf first: the block is still cached.
        index.apply_batch(W1, [Removed([12])])
        assert index.overlaps(OWN) == {W1: 2}
        assert index.copies(W1, 12) == 1
        # Then the other copy, then the root.
        index.apply_batch(W1, [Removed([12]), Removed([11])])
        assert index.overlaps(OWN) == {}
        assert index.counters.duplicate_stores == 1

    def test_matches_the_mock_vllm_cache_through_eviction(self):
        """The event sequence of the mock engine's vLLM-policy cache (the real wire, decoded)
        keeps the index equal to what the cache holds, repeats and evictions included."""
        from switchyard.mock_engine.config import EventFormat, HashForm
        from switchyard.mock_engine.kv_cache import VLLM_POLICY, EngineHasher, PrefixCache
        from switchyard.mock_engine.kv_wire import WireEncoder
        from switchyard.mock_engine.types import EventBatch
        from switchyard.router.kv.decode import decode_payload

        cache = PrefixCache(block_size=BS, num_blocks=6, hasher=EngineHasher(7), policy=VLLM_POLICY)
        encode = WireEncoder(EventFormat.ARRAY, HashForm.UINT)
        index = KvIndex()
        prompts = [PROMPT[:8], PROMPT[:8], PROMPT[:8], list(range(500, 516)), PROMPT[:8]]
        for seq, prompt in enumerate(prompts):
            lease = cache.begin(prompt)
            events = cache.commit(lease, prompt, len(prompt))
            cache.release(lease)
            index.apply_batch(
                W1, decode_payload(encode(EventBatch(seq, 0.0, tuple(events)))).records
            )
            for depth in range(1, len(prompt) // BS + 1):
                engine_ids = cache.hasher.chain(prompt[: depth * BS], BS)
                held = all(h in cache for h in engine_ids)
                got = index.overlaps(block_hashes(prompt[: depth * BS], BS)).get(W1, 0)
                assert (got == depth) == held, (seq, depth)
            for engine_id in cache.hasher.chain(prompt, BS):
                assert index.copies(W1, engine_id) == cache.copies(engine_id)


class TestTiers:
    def test_offloaded_blocks_counted_apart(self):
        index = KvIndex()
        index.apply_batch(W1, [store([1, 2], None, PROMPT[:8])])
        index.apply_batch(W1, [store([3, 4], 2, PROMPT[8:16], medium="CPU_PINNED")])
        assert index.overlaps(OWN) == {W1: 2}
        assert index.overlaps_any_tier(OWN) == {W1: 4}
        assert index.size(W1, OFFLOADED) == 2

    def test_any_tier_empty_without_offloaded_blocks(self):
        index = KvIndex()
        chain(index, W1, 4)
        assert not index.has_offloaded()
        assert index.overlaps_any_tier(OWN) == {}

    def test_device_eviction_to_host(self):
        index = KvIndex()
        index.apply_batch(W1, [store([1], None, PROMPT[:4])])
        index.apply_batch(
            W1, [Removed([1], medium="GPU"), store([1], None, PROMPT[:4], medium="CPU")]
        )
        assert index.overlaps(OWN) == {}
        assert index.overlaps_any_tier(OWN) == {W1: 1}


class TestHybridGroups:
    """A hybrid model's KV-cache groups publish the same hashes: only main-attention groups
    decide, so the sliding-window group's early eviction drops nothing."""

    def test_sliding_window_eviction_keeps_the_full_attention_block(self):
        index = KvIndex()
        full = dict(group_idx=0, kv_cache_spec_kind="full_attention")
        window = dict(group_idx=1, kv_cache_spec_kind="sliding_window")
        index.apply_batch(
            W1,
            [store([1, 2], None, PROMPT[:8], **full), store([1, 2], None, PROMPT[:8], **window)],
        )
        assert index.copies(W1, 1) == 1  # the window group's store is not a copy
        index.apply_batch(W1, [Removed([1, 2], group_idx=1)])  # window slides past them
        assert index.overlaps(OWN) == {W1: 2}
        index.apply_batch(W1, [Removed([2], group_idx=0)])
        assert index.overlaps(OWN) == {W1: 1}
        assert index.counters.skipped_group == 2

    def test_kindless_event_follows_the_learned_group(self):
        index = KvIndex()
        index.apply_batch(
            W1, [store([9], None, PROMPT[:4], group_idx=3, kv_cache_spec_kind="mamba")]
        )
        index.apply_batch(W1, [store([1], None, PROMPT[:4], group_idx=3)])
        assert len(index) == 0
        index.apply_batch(W1, [store([1], None, PROMPT[:4], group_idx=5)])  # unknown: main
        assert index.overlaps(OWN) == {W1: 1}


class TestRanks:
    def test_ranks_of_one_instance_are_separate_workers(self):
        index = KvIndex()
        chain(index, (1, 0), 2)
        chain(index, (1, 1), 8, first_hash=1)
        assert index.overlaps(OWN) == {(1, 0): 2, (1, 1): 8}
        index.remove_instance(1)
        assert index.overlaps(OWN) == {}
        assert index.workers() == []


class _Reference:
    """The index's rules restated the slow, obvious way (one worker, the device tier): each
    engine hash names one router hash and counts its physical copies."""

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[int, int]] = {}  # engine hash -> (router hash, copies)

    def store(self, hashes: list[int], parent: int | None, tokens: list[int]) -> None:
        if parent is not None:
            if parent not in self.blocks:
                return
            parent = self.blocks[parent][0]
        for engine_hash, own in zip(hashes, block_hashes(tokens, BS, parent), strict=True):
            held = self.blocks.get(engine_hash)
            if held is not None and held[0] == own:
                self.blocks[engine_hash] = (own, held[1] + 1)
            else:
                self.blocks[engine_hash] = (own, 1)

    def remove(self, hashes: list[int]) -> None:
        for engine_hash in hashes:
            held = self.blocks.get(engine_hash)
            if held is None:
                continue
            if held[1] > 1:
                self.blocks[engine_hash] = (held[0], held[1] - 1)
            else:
                del self.blocks[engine_hash]

    def owns(self) -> set[int]:
        return {own for own, _ in self.blocks.values()}


class TestBulkPathsMatchTheRules:
    """The store and removal fast paths (bulk dict operations, aliases kept apart) against
    a reference model, on random event sequences with repeats, aliases, shared content,
    unknown removals and reused engine hashes."""

    def test_random_sequences(self):
        import random

        rng = random.Random(7)
        contents = [list(range(100 + 32 * c, 132 + 32 * c)) for c in range(3)]
        for trial in range(200):
            index, refs = KvIndex(), {W1: _Reference(), W2: _Reference()}
            for _ in range(30):
                worker = rng.choice((W1, W2))
                ref = refs[worker]
                if rng.random() < 0.6:
                    tokens = rng.choice(contents)
                    start = rng.randrange(0, 7)
                    count = rng.randrange(1, 9 - start)
                    base = rng.choice((1000, 2000, 3000))  # few id ranges: aliases, reuse
                    hashes = [base + start + k for k in range(count)]
                    parent = None if start == 0 else base + start - 1
                    piece = tokens[start * BS : (start + count) * BS]
                    index.apply_batch(worker, [store(hashes, parent, piece)])
                    ref.store(hashes, parent, piece)  # an unknown parent: skipped by both
                else:
                    pool = list(ref.blocks) or [5]
                    hashes = rng.sample(pool, min(len(pool), rng.randrange(1, 6)))
                    if rng.random() < 0.3:
                        hashes.append(9999)  # never stored
                    index.apply_batch(worker, [Removed(hashes)])
                    ref.remove(hashes)
                for key, r in refs.items():
                    assert index.size(key) == len(r.owns()), trial
                    for engine_hash, (own, copies) in r.blocks.items():
                        assert index.copies(key, engine_hash) == copies, trial
                        assert key in index.holders(own), trial
                holders = {own for r in refs.values() for own in r.owns()}
                assert len(index) == len(holders), trial


class TestAliases:
    def test_alias_kept_until_its_last_engine_hash_goes(self):
        index = KvIndex()
        index.apply_batch(W1, [store([1, 2], None, PROMPT[:8])])
        index.apply_batch(W1, [store([11, 12], None, PROMPT[:8])])  # same content, new ids
        assert index.size(W1) == 2
        index.apply_batch(W1, [Removed([1, 2])])
        assert index.overlaps(OWN) == {W1: 2} and index.size(W1) == 2
        index.apply_batch(W1, [Removed([12])])
        assert index.overlaps(OWN) == {W1: 1} and index.size(W1) == 1
        index.apply_batch(W1, [Removed([11])])
        assert index.overlaps(OWN) == {} and index.size(W1) == 0 and len(index) == 0

    def test_removal_of_blocks_partly_shared_with_another_worker(self):
        index = KvIndex()
        chain(index, W1, 8)
        chain(index, W2, 4, first_hash=1)
        index.apply_batch(W1, [Removed([1002, 1003, 1004, 1005, 77])])  # 77: unknown
        assert index.overlaps(OWN) == {W1: 2, W2: 4}
        assert len(index) == 6  # blocks 4 and 5 went with their only holder
        assert index.holders(OWN[3]) == {W2} and index.holders(OWN[4]) == set()


class TestPackedTokenIds:
    """The ZMQ path's BlockStored keeps its token ids as msgpack (decode_payload_packed, hashed
    by the C extension): an index fed that way ends exactly as one fed token lists."""

    @staticmethod
    def random_payloads(rng, encoding: str, size: int) -> list[bytes]:
        from switchyard.router.kv.tests.wire import payload, removed_array, removed_map

        stored_event = stored_array_or_map(encoding)
        payloads = []
        held: list[int] = []
        next_hash = 1
        for _ in range(40):
            events = []
            for _ in range(rng.randrange(1, 4)):
                n = rng.randrange(0, 4)
                hashes = list(range(next_hash, next_hash + n))
                next_hash += n
                parent = rng.choice([None, held[-1] if held else None, 10**9])
                cells: list = [rng.randrange(2**32) for _ in range(n * size)]
                kind = rng.random()
                if kind < 0.1 and cells:
                    cells[rng.randrange(len(cells))] = rng.choice([-1, 2**32, 2**64 - 1])
                elif kind < 0.15 and cells:
                    cells[rng.randrange(len(cells))] = rng.choice(["7", 1.5, None, [1], [1, 2, 3]])
                elif kind < 0.2:
                    cells.append(5)  # a token more than the blocks cover
                elif kind < 0.3:
                    cells = [[c, rng.randrange(99)] for c in cells]  # Eagle bigram cells
                block_size = 0 if rng.random() < 0.2 else size
                events.append(stored_event(hashes, parent, cells, block_size))
                held += hashes
            if held and rng.random() < 0.3:
                gone = [held.pop(rng.randrange(len(held))) for _ in range(min(3, len(held)))]
                events.append(removed_array(gone) if encoding == "array" else removed_map(gone))
            payloads.append(payload(events))
        return payloads

    @pytest.mark.parametrize("encoding", ["array", "map"])
    @pytest.mark.parametrize("size", [1, 16, 32, 64, 128])
    def test_same_index_as_token_lists(self, encoding, size):
        from switchyard.common.block_hash import NATIVE
        from switchyard.router.kv.decode import decode_payload, decode_payload_packed

        if not NATIVE:
            pytest.skip("the C extension is not built: both decoders give lists")
        rng = random.Random(size)
        payloads = self.random_payloads(rng, encoding, size)
        by_list, by_packed = KvIndex(), KvIndex()
        packed_seen = 0
        for body in payloads:
            for index, decode in ((by_list, decode_payload), (by_packed, decode_payload_packed)):
                batch = decode(body)
                index.counters.unknown_events += batch.skipped
                index.apply_batch(W1, batch.records)
            packed_seen += sum(
                type(r.token_ids) is msgspec.Raw
                for r in decode_payload_packed(body).records
                if r.KIND == Stored.KIND
            )
        assert packed_seen > 0
        assert by_packed.counters == by_list.counters
        assert by_list.counters.malformed_stored > 0
        assert by_packed._masks == by_list._masks
        assert by_packed._workers[W1].tiers[0].own_of == by_list._workers[W1].tiers[0].own_of


def stored_array_or_map(encoding: str):
    from switchyard.router.kv.tests.wire import stored_array, stored_map

    return stored_array if encoding == "array" else stored_map
