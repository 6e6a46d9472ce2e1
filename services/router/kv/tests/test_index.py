from switchyard.common.block_hash import block_hashes
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.types import CLEARED, Removed, Stored

BS = 4
PROMPT = list(range(100, 132))  # 8 blocks of 4
OWN = block_hashes(PROMPT, BS)


def store(hashes, parent, tokens, block_size=BS, **kw):
    return Stored(hashes, parent, tokens, block_size, **kw)


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
        chain(index, 1, 8)
        assert index.overlaps(OWN) == {1: 8}
        assert index.size(1) == 8
        assert len(index) == 8
        assert index.holders(OWN[3]) == {1}

    def test_same_content_on_two_workers_shares_keys(self):
        index = KvIndex()
        chain(index, 1, 8, first_hash=1)
        chain(index, 2, 3, first_hash=2**64 - 100)  # other engine hashes, same content
        assert index.overlaps(OWN) == {1: 8, 2: 3}
        assert len(index) == 8

    def test_one_event_with_many_blocks(self):
        index = KvIndex()
        index.apply_batch(1, [store(list(range(8)), None, PROMPT)])
        assert index.overlaps(OWN) == {1: 8}

    def test_block_size_inferred_when_missing(self):
        index = KvIndex()
        index.apply_batch(1, [store([1, 2], None, PROMPT[:8], block_size=0)])
        assert index.overlaps(OWN) == {1: 2}

    def test_restore_is_idempotent(self):
        index = KvIndex()
        chain(index, 1, 4)
        chain(index, 1, 4)
        index.apply_batch(1, [Removed([1000, 1001, 1002, 1003])])
        assert index.overlaps(OWN) == {}
        assert len(index) == 0

    def test_same_content_under_two_engine_hashes_needs_both_removed(self):
        index = KvIndex()
        index.apply_batch(1, [store([1], None, PROMPT[:4]), store([2], None, PROMPT[:4])])
        assert index.size(1) == 1
        index.apply_batch(1, [Removed([1])])
        assert index.overlaps(OWN) == {1: 1}
        index.apply_batch(1, [Removed([2])])
        assert index.overlaps(OWN) == {}

    def test_engine_hash_reused_for_other_content(self):
        index = KvIndex()
        index.apply_batch(1, [store([7], None, PROMPT[:4])])
        index.apply_batch(1, [store([7], None, [9, 9, 9, 9])])
        assert index.overlaps(OWN) == {}
        assert index.overlaps(block_hashes([9, 9, 9, 9], BS)) == {1: 1}
        assert len(index) == 1


class TestUnknownParent:
    def test_skipped_and_counted(self):
        index = KvIndex()
        index.apply_batch(1, [store([5], 999, PROMPT[4:8])])
        assert index.counters.unknown_parent == 1
        assert len(index) == 0
        assert index.size(1) == 0

    def test_parent_known_only_on_another_worker(self):
        index = KvIndex()
        chain(index, 1, 2)
        index.apply_batch(2, [store([5], 1001, PROMPT[8:12])])
        assert index.counters.unknown_parent == 1
        assert index.overlaps(OWN) == {1: 2}

    def test_parent_removed_before_child_stored(self):
        index = KvIndex()
        chain(index, 1, 2)
        index.apply_batch(1, [Removed([1001]), store([1002], 1001, PROMPT[8:12])])
        assert index.counters.unknown_parent == 1
        assert index.overlaps(OWN) == {1: 1}


class TestSkipped:
    def test_token_ids_not_covering_blocks(self):
        index = KvIndex()
        index.apply_batch(1, [store([1, 2], None, PROMPT[:7])])
        assert index.counters.malformed_stored == 1
        assert len(index) == 0

    def test_token_ids_outside_u32(self):
        index = KvIndex()
        index.apply_batch(1, [store([1], None, [-1, 2, 3, 4])])
        assert index.counters.malformed_stored == 1

    def test_off_device_and_lora_blocks(self):
        index = KvIndex()
        index.apply_batch(
            1,
            [
                store([1], None, PROMPT[:4], device=False),
                store([2], None, PROMPT[:4], namespace=3),
                Removed([1], device=False),
            ],
        )
        assert len(index) == 0
        assert index.counters.skipped_tier == 2
        assert index.counters.skipped_namespace == 1

    def test_host_removal_leaves_device_copy(self):
        index = KvIndex()
        chain(index, 1, 2)
        index.apply_batch(1, [Removed([1000, 1001], device=False)])
        assert index.overlaps(OWN) == {1: 2}

    def test_empty_store_and_unknown_removal(self):
        index = KvIndex()
        index.apply_batch(1, [store([], None, []), Removed([42])])
        assert len(index) == 0
        assert index.counters.events_applied == 2
        assert index.counters.batches_applied == 1


class TestRemove:
    def test_removes_worker_from_blocks(self):
        index = KvIndex()
        chain(index, 1, 8)
        chain(index, 2, 8, first_hash=5000)
        index.apply_batch(1, [Removed([1006, 1007])])
        assert index.overlaps(OWN) == {1: 6, 2: 8}
        assert index.size(1) == 6
        assert index.holders(OWN[7]) == {2}

    def test_blocks_nobody_holds_are_dropped(self):
        index = KvIndex()
        chain(index, 1, 8)
        index.apply_batch(1, [Removed(list(range(1000, 1008)))])
        assert len(index) == 0
        assert index.size(1) == 0

    def test_removing_a_middle_block_cuts_the_prefix(self):
        index = KvIndex()
        chain(index, 1, 8)
        index.apply_batch(1, [Removed([1003])])
        assert index.overlaps(OWN) == {1: 3}


class TestClear:
    def test_all_blocks_cleared(self):
        index = KvIndex()
        chain(index, 1, 8)
        chain(index, 2, 4, first_hash=1)
        index.apply_batch(1, [CLEARED])
        assert index.overlaps(OWN) == {2: 4}
        assert index.size(1) == 0
        assert len(index) == 4

    def test_clear_then_store_in_one_batch(self):
        index = KvIndex()
        chain(index, 1, 8)
        index.apply_batch(1, [CLEARED, store([1], None, PROMPT[:4])])
        assert index.overlaps(OWN) == {1: 1}

    def test_clear_worker(self):
        index = KvIndex()
        chain(index, 1, 8)
        index.clear_worker(1)
        index.clear_worker(99)  # unknown: nothing
        assert len(index) == 0
        assert index.workers() == [1]

    def test_parents_forgotten_after_clear(self):
        index = KvIndex()
        chain(index, 1, 2)
        index.apply_batch(1, [CLEARED, store([1002], 1001, PROMPT[8:12])])
        assert index.counters.unknown_parent == 1


class TestRemoveWorker:
    def test_remove_worker(self):
        index = KvIndex()
        chain(index, 1, 8)
        chain(index, 2, 8, first_hash=1)
        index.remove_worker(1)
        index.remove_worker(1)  # twice: nothing
        assert index.overlaps(OWN) == {2: 8}
        assert index.workers() == [2]
        assert index.size(1) == 0

    def test_slot_reused_without_leaking_blocks(self):
        index = KvIndex()
        chain(index, 1, 8)
        index.remove_worker(1)
        chain(index, 3, 2)  # takes worker 1's bit
        assert index.overlaps(OWN) == {3: 2}
        assert len(index) == 2


class TestOverlaps:
    def test_empty_request_and_empty_index(self):
        index = KvIndex()
        assert index.overlaps([]) == {}
        assert index.overlaps(OWN) == {}
        chain(index, 1, 2)
        assert index.overlaps([]) == {}

    def test_stops_at_first_miss_per_worker(self):
        index = KvIndex()
        chain(index, 1, 8)
        chain(index, 2, 5, first_hash=1)
        chain(index, 3, 2, first_hash=50)
        index.apply_batch(1, [Removed([1001])])  # worker 1 misses block 1, holds 2..7
        assert index.overlaps(OWN) == {1: 1, 2: 5, 3: 2}

    def test_worker_without_the_first_block_is_absent(self):
        index = KvIndex()
        chain(index, 1, 8)
        index.apply_batch(1, [Removed([1000])])
        assert index.overlaps(OWN) == {}

    def test_request_longer_than_cached_prefix(self):
        index = KvIndex()
        chain(index, 1, 3)
        longer = block_hashes(PROMPT + list(range(64)), BS)
        assert index.overlaps(longer) == {1: 3}

    def test_divergent_request(self):
        index = KvIndex()
        chain(index, 1, 8)
        other = block_hashes(PROMPT[:12] + [0, 0, 0, 0] + PROMPT[16:], BS)
        assert index.overlaps(other) == {1: 3}

    def test_many_workers(self):
        index = KvIndex()
        for worker in range(100):
            chain(index, worker, worker % 9, first_hash=worker * 100)
        expected = {w: w % 9 for w in range(100) if w % 9}
        assert index.overlaps(OWN + [12345]) == {w: min(d, 8) for w, d in expected.items()}
