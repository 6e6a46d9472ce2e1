"""The prefix index over every worker's KV cache, keyed by the router's own block hash.

Engine block hashes are opaque ids; the index keys each block by `switchyard.common.block_hash`
of its token ids, chained with the parent block's router hash, so a request's
`block_hashes(prompt, block_size)` meets the engines' blocks on the same keys. Per worker it
keeps engine hash -> router hash to resolve removals and parents.

Layout: `_masks` maps router hash -> bitmask of the workers holding the block (each worker owns
one bit, reused after it leaves), so `overlaps` is one dict lookup and one int AND per request
block. Per worker, `own_of` maps engine hash -> router hash and `refs` counts the engine
hashes behind each router hash (two engine ids may name the same content).

Rules:
- A BlockStored whose parent this worker never stored (or already removed) is skipped and
  counted (`unknown_parent`): without the parent's router hash its blocks cannot be keyed, and
  indexing them as roots would claim prefixes the worker does not hold.
- Only device-tier blocks of the base model are indexed: events about host/disk tiers
  (`skipped_tier`) and blocks stored under a LoRA or cache salt (`skipped_namespace`) are not.
- A BlockStored whose token_ids do not cover its blocks exactly is skipped (`malformed_stored`).
- Index a prompt with the same block size as the engine's (Instance.block_size): blocks hashed
  at another size never match.

Pure and synchronous: no I/O, no locks; callers apply batches from one event loop.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from switchyard.common.block_hash import block_hashes
from switchyard.router.kv.types import Cleared, KvCounters, Record, Removed, Stored


class _Worker:
    __slots__ = ("instance_id", "slot", "bit", "own_of", "refs")

    def __init__(self, instance_id: int, slot: int) -> None:
        self.instance_id = instance_id
        self.slot = slot
        self.bit = 1 << slot
        self.own_of: dict[int, int] = {}  # engine hash -> router hash
        self.refs: dict[int, int] = {}  # router hash -> engine hashes naming it


class KvIndex:
    def __init__(self, counters: KvCounters | None = None) -> None:
        self.counters = counters if counters is not None else KvCounters()
        self._masks: dict[int, int] = {}  # router hash -> bitmask of holding workers
        self._workers: dict[int, _Worker] = {}
        self._slots: list[int | None] = []  # bit position -> instance id
        self._free: list[int] = []  # heap of reusable bit positions

    # ---- events -------------------------------------------------------------------------

    def apply_batch(self, instance_id: int, records: Iterable[Record]) -> None:
        """Apply one batch of a worker's events, in order."""
        worker = self._worker(instance_id)
        applied = 0
        for record in records:
            kind = type(record)
            if kind is Stored:
                self._store(worker, record)
            elif kind is Removed:
                self._remove(worker, record)
            elif kind is Cleared:
                self._clear(worker)
            applied += 1
        self.counters.events_applied += applied
        self.counters.batches_applied += 1

    def clear_worker(self, instance_id: int) -> None:
        """Forget every block of a worker (AllBlocksCleared, an engine restart)."""
        worker = self._workers.get(instance_id)
        if worker is not None:
            self._clear(worker)

    def remove_worker(self, instance_id: int) -> None:
        worker = self._workers.pop(instance_id, None)
        if worker is None:
            return
        self._clear(worker)
        self._slots[worker.slot] = None
        heapq.heappush(self._free, worker.slot)

    # ---- queries ------------------------------------------------------------------------

    def overlaps(self, request_block_hashes: Sequence[int]) -> dict[int, int]:
        """instance id -> number of leading blocks of the request the worker holds. Workers
        that do not hold the first block are absent (overlap 0)."""
        result: dict[int, int] = {}
        get = self._masks.get
        active = -1  # every bit: the set of workers still matching
        for depth, h in enumerate(request_block_hashes):
            matching = active & get(h, 0)
            if matching != active:
                if depth:
                    self._credit(result, active & ~matching, depth)
                if not matching:
                    return result
                active = matching
        if active != -1:
            self._credit(result, active, len(request_block_hashes))
        return result

    def size(self, instance_id: int) -> int:
        """Distinct blocks the worker holds (0 for an unknown worker)."""
        worker = self._workers.get(instance_id)
        return len(worker.refs) if worker is not None else 0

    def workers(self) -> list[int]:
        return list(self._workers)

    def holders(self, router_hash: int) -> set[int]:
        """Workers holding one block (for tests and debugging)."""
        result: dict[int, int] = {}
        self._credit(result, self._masks.get(router_hash, 0), 0)
        return set(result)

    def __len__(self) -> int:
        """Distinct blocks over all workers."""
        return len(self._masks)

    # ---- internals ----------------------------------------------------------------------

    def _worker(self, instance_id: int) -> _Worker:
        worker = self._workers.get(instance_id)
        if worker is None:
            if self._free:
                slot = heapq.heappop(self._free)
                self._slots[slot] = instance_id
            else:
                slot = len(self._slots)
                self._slots.append(instance_id)
            worker = self._workers[instance_id] = _Worker(instance_id, slot)
        return worker

    def _credit(self, result: dict[int, int], bits: int, depth: int) -> None:
        slots = self._slots
        while bits:
            low = bits & -bits
            instance_id = slots[low.bit_length() - 1]
            if instance_id is not None:
                result[instance_id] = depth
            bits ^= low

    def _store(self, worker: _Worker, record: Stored) -> None:
        counters = self.counters
        if not record.device:
            counters.skipped_tier += 1
            return
        if record.namespace is not None:
            counters.skipped_namespace += 1
            return
        engine_hashes = record.block_hashes
        tokens = record.token_ids
        n = len(engine_hashes)
        if n == 0:
            return
        size = record.block_size or len(tokens) // n
        if size <= 0 or len(tokens) != n * size:
            counters.malformed_stored += 1
            return
        own_of = worker.own_of
        parent = record.parent
        if parent is not None:
            parent = own_of.get(parent)
            if parent is None:
                counters.unknown_parent += 1
                return
        try:
            owns = block_hashes(tokens, size, parent)
        except (TypeError, ValueError):  # token ids that are not u32
            counters.malformed_stored += 1
            return
        refs = worker.refs
        masks = self._masks
        bit = worker.bit
        for engine_hash, own in zip(engine_hashes, owns, strict=True):
            previous = own_of.get(engine_hash)
            if previous == own:
                continue  # stored again (vLLM re-stores a fully cached prompt's last block)
            if previous is not None:
                self._release(worker, previous)
            own_of[engine_hash] = own
            count = refs.get(own, 0)
            refs[own] = count + 1
            if not count:
                masks[own] = masks.get(own, 0) | bit

    def _remove(self, worker: _Worker, record: Removed) -> None:
        if not record.device:
            self.counters.skipped_tier += 1
            return
        pop = worker.own_of.pop
        for engine_hash in record.block_hashes:
            own = pop(engine_hash, None)
            if own is not None:  # unknown: a block we skipped, or never saw stored
                self._release(worker, own)

    def _release(self, worker: _Worker, own: int) -> None:
        refs = worker.refs
        count = refs[own] - 1
        if count:
            refs[own] = count
            return
        del refs[own]
        mask = self._masks[own] & ~worker.bit
        if mask:
            self._masks[own] = mask
        else:
            del self._masks[own]

    def _clear(self, worker: _Worker) -> None:
        masks = self._masks
        keep = ~worker.bit
        for own in worker.refs:
            mask = masks[own] & keep
            if mask:
                masks[own] = mask
            else:
                del masks[own]
        worker.own_of.clear()
        worker.refs.clear()
