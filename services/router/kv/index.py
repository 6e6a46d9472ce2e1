"""The prefix index over every worker's KV cache, keyed by the router's own block hash.

A worker is one KV cache: an (instance id, data-parallel rank) pair (`WorkerKey`). Engine
block hashes are opaque ids; the index keys each block by `switchyard.common.block_hash` of
its token ids, chained with the parent block's router hash, so a request's
`block_hashes(prompt, block_size)` meets the engines' blocks on the same keys.

Layout: per tier (the device, and "offloaded": host memory or local disk), `masks` maps router
hash -> bitmask of the workers holding the block (each worker owns one bit, reused after it
leaves), so `overlaps` is one dict lookup and one int AND per request block. Per worker and
tier, `own_of` maps engine hash -> router hash, `copies` counts the physical copies of an
engine hash beyond the first (vLLM stores the last block of an exact block-aligned repeat
again, as a second block under the same hash, and removes each copy with its own
BlockRemoved), and `aliases` counts the engine hashes beyond the first that name one router
hash (rare: two engine blocks of the same content). Whether a worker holds a router hash is
its bit in `masks`, so the common store and removal touch two dicts per block, not three.

Rules:
- A BlockStored whose parent this worker never stored (or already removed) is skipped and
  counted (`unknown_parent`): without the parent's router hash its blocks cannot be keyed, and
  indexing them as roots would claim prefixes the worker does not hold.
- Tiers (`medium`): GPU / device (or none said) is the device tier; CPU, CPU_PINNED, DISK,
  ... (SGLang HiCache, vLLM offloading) the offloaded tier, counted apart so a router can
  weigh a host hit below a device one; REMOTE / EXTERNAL / SHARED pools and a non-local
  `locality` are not this worker's cache (`skipped_tier`). An unknown medium is the device.
- Hybrid models (vLLM `group_idx` / `kv_cache_spec_kind`): each KV-cache group publishes the
  same block hashes. Only main-attention groups (full, MLA, sink-full attention) are indexed;
  sliding-window and state-space groups are skipped (`skipped_group`), so their earlier
  evictions never drop a block the full-attention group still holds. An event without a kind
  follows what the worker's group was learned to be; an unknown group counts as main. (vLLM's
  hybrid coordinator reuses a prefix only as far as every group can: the full-attention hit,
  shortened until the sliding-window group holds the window before it. Indexing the
  full-attention group is the upper bound of that, exact for models whose window groups keep
  their recent blocks, which LRU eviction favours.)
- Blocks stored under a LoRA (`lora_id` / `lora_name`), a cache salt or other per-block
  `extra_keys` (multimodal items) are not indexed (`skipped_namespace`): the engine hashed
  them with inputs a prompt's token ids do not carry.
- A BlockStored whose token_ids do not cover its blocks exactly is skipped (`malformed_stored`).
  Its token_ids are a list, or (StoredPacked, from the ZMQ decoder) the msgpack array as it
  came, hashed from its bytes in C.
- Index a prompt with the same block size as the engine's (Instance.block_size).

Pure and synchronous: no I/O, no locks; callers apply batches from one event loop.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import and_
from typing import cast

from msgspec import Raw

from switchyard.common.block_hash import block_hashes, native
from switchyard.common.native import load
from switchyard.router.kv.types import (
    CLEARED_KIND,
    REMOVED,
    STORED,
    EngineHash,
    KvCounters,
    Record,
    Removed,
    Stored,
    WorkerKey,
)

DEVICE, OFFLOADED = 0, 1
SKIP = -1
_TIER_OF_MEDIUM = {
    "GPU": DEVICE,
    "DEVICE": DEVICE,
    "HBM": DEVICE,
    "CPU": OFFLOADED,
    "CPU_PINNED": OFFLOADED,
    "CPU_TIER1": OFFLOADED,
    "CPU_TIER2": OFFLOADED,
    "HOST": OFFLOADED,
    "DISK": OFFLOADED,
    "NVME": OFFLOADED,
    "STORAGE": OFFLOADED,
    "EXTERNAL": SKIP,
    "NETWORK": SKIP,
    "REMOTE": SKIP,
    "SHARED": SKIP,
}
MAIN_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
_RESIDENCY_AGENT = "kvcr"  # blocks a residency agent owns, not the engine's own cache
_NONES: repeat[None] = repeat(None)
_CHUNK = 32  # blocks hashed at a time by a lazy walk: at most this many hashed in vain
# Packed token ids (types.StoredPacked) come only from a build with the C extension.
if native is not None:
    token_count = native.token_count
    msgpack_block_hashes = native.msgpack_block_hashes
_DONE, _ALIASES, _KNOWN = 0, 1, 2  # what store_new did


def _store_new(
    own_of: dict[EngineHash, int],
    masks: dict[int, int],
    engine_hashes: Sequence[EngineHash],
    owns: Sequence[int],
    bit: int,
) -> int:
    """A store's common case, as bulk dict operations. _KNOWN: an engine hash is held
    already, nothing done. Else `own_of` maps the engine hashes to their router hashes, and
    then _DONE: every router hash was new, each now has the worker's bit; _ALIASES: one was in
    `masks` already, which is left to the caller. (_index.store_new, in C, where built.)"""
    if not own_of.keys().isdisjoint(engine_hashes):
        return _KNOWN
    own_of.update(zip(engine_hashes, owns, strict=True))
    if not masks.keys().isdisjoint(owns):
        return _ALIASES
    masks.update(zip(owns, repeat(bit)))
    return _DONE


def _remove_plain(
    own_of: dict[EngineHash, int],
    masks: dict[int, int],
    engine_hashes: Sequence[EngineHash],
    keep: int,
) -> None:
    """A removal's common case (each engine hash one block of its own content: no copies, no
    aliases): pop the engine hashes, clear the worker's bit (`keep`: its complement) from
    their router hashes' masks, dropping masks left empty. (_index.remove_plain, in C.)"""
    popped: list[int | None] = list(map(own_of.pop, engine_hashes, _NONES))
    # None: unknown, a block we skipped or never saw stored
    owns = cast(
        "list[int]", [own for own in popped if own is not None] if None in popped else popped
    )
    left = list(map(and_, map(masks.__getitem__, owns), repeat(keep)))
    if not any(left):  # held by this worker alone
        deque(map(masks.__delitem__, owns), maxlen=0)
    elif all(left):  # held by others too
        masks.update(zip(owns, left, strict=True))
    else:
        for own, mask in zip(owns, left, strict=True):
            if mask:
                masks[own] = mask
            else:
                del masks[own]


_index = load("switchyard.router.kv._index")  # None: not built, or SWITCHYARD_NATIVE=0
store_new = _index.store_new if _index is not None else _store_new
remove_plain = _index.remove_plain if _index is not None else _remove_plain


def tier_of(medium: str | None, locality: str | None = None) -> int:
    if locality is not None and locality.upper() != "LOCAL":
        return SKIP
    if medium is None:
        return DEVICE
    tier = _TIER_OF_MEDIUM.get(medium)
    if tier is None:
        tier = _TIER_OF_MEDIUM.get(medium.upper(), DEVICE)
    return tier


class _TierState:
    __slots__ = ("own_of", "copies", "aliases", "aliased")

    def __init__(self) -> None:
        self.own_of: dict[EngineHash, int] = {}  # engine hash -> router hash
        self.copies: dict[EngineHash, int] = {}  # engine hash -> copies beyond the first
        self.aliases: dict[int, int] = {}  # router hash -> engine hashes beyond the first
        self.aliased = 0  # sum of `aliases` values: len(own_of) - aliased distinct blocks

    def blocks(self) -> set[int]:
        """The distinct router hashes held."""
        return set(self.own_of.values())


class _Worker:
    __slots__ = ("key", "slot", "bit", "tiers", "groups")

    def __init__(self, key: WorkerKey, slot: int) -> None:
        self.key = key
        self.slot = slot
        self.bit = 1 << slot
        self.tiers = (_TierState(), _TierState())
        self.groups: dict[int, bool] = {}  # cache group -> is a main-attention group


class KvIndex:
    def __init__(self, counters: KvCounters | None = None) -> None:
        self.counters = counters if counters is not None else KvCounters()
        # per tier: router hash -> bitmask of holding workers
        self._masks: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self._workers: dict[WorkerKey, _Worker] = {}
        self._slots: list[WorkerKey | None] = []  # bit position -> worker
        self._free: list[int] = []  # heap of reusable bit positions

    # ---- events -------------------------------------------------------------------------

    def apply_batch(self, worker: WorkerKey, records: Iterable[Record]) -> None:
        """Apply one batch of a worker's events, in order."""
        w = self._worker(worker)
        applied = 0
        for record in records:
            kind = record.KIND
            if kind == STORED:
                self._store(w, record)  # type: ignore[arg-type]
            elif kind == REMOVED:
                self._remove(w, record)  # type: ignore[arg-type]
            elif kind == CLEARED_KIND and record.ownership is None:  # type: ignore[union-attr]
                self._clear(w)
            applied += 1
        counters = self.counters
        counters.events_applied += applied
        counters.batches_applied += 1

    def clear_worker(self, worker: WorkerKey) -> None:
        """Forget every block of a worker (AllBlocksCleared, an engine restart)."""
        w = self._workers.get(worker)
        if w is not None:
            self._clear(w)
            w.groups.clear()

    def remove_worker(self, worker: WorkerKey) -> None:
        w = self._workers.pop(worker, None)
        if w is None:
            return
        self._clear(w)
        self._slots[w.slot] = None
        heapq.heappush(self._free, w.slot)

    def remove_instance(self, instance_id: int) -> None:
        """Drop every rank of an instance."""
        for key in [k for k in self._workers if k[0] == instance_id]:
            self.remove_worker(key)

    # ---- queries ------------------------------------------------------------------------

    def overlaps(self, request_block_hashes: Sequence[int]) -> dict[WorkerKey, int]:
        """worker -> number of leading blocks of the request it holds on the device. Workers
        that do not hold the first block are absent (overlap 0)."""
        return self._walk(request_block_hashes, self._masks[DEVICE], None)

    def overlaps_any_tier(self, request_block_hashes: Sequence[int]) -> dict[WorkerKey, int]:
        """worker -> leading blocks held on the device or offloaded (empty without offloaded
        blocks anywhere)."""
        offloaded = self._masks[OFFLOADED]
        if not offloaded:
            return {}
        return self._walk(request_block_hashes, self._masks[DEVICE], offloaded)

    def has_offloaded(self) -> bool:
        return bool(self._masks[OFFLOADED])

    def _walk(
        self, hashes: Sequence[int], masks: dict[int, int], extra: dict[int, int] | None
    ) -> dict[WorkerKey, int]:
        result: dict[WorkerKey, int] = {}
        get = masks.get
        other = extra.get if extra is not None else None
        active = -1  # every bit: the set of workers still matching
        total = len(hashes)
        # A prompt's lazily hashed blocks (router.prompt_hashes.PromptBlocks) are hashed only
        # as deep as some worker still matches, a chunk at a time.
        upto = getattr(hashes, "upto", None)
        known: Sequence[int] = hashes if upto is None else upto(1)  # a cold prompt: one
        depth = 0
        while True:
            for h in known[depth:] if depth else known:
                held = get(h, 0) if other is None else get(h, 0) | other(h, 0)
                matching = active & held
                if matching != active:
                    if depth:
                        self._credit(result, active & ~matching, depth)
                    if not matching:
                        return result
                    active = matching
                depth += 1
            if depth >= total or upto is None:
                break
            known = upto(depth + _CHUNK)
        if active != -1:
            self._credit(result, active, total)
        return result

    def size(self, worker: WorkerKey, tier: int = DEVICE) -> int:
        """Distinct blocks the worker holds on a tier (0 for an unknown worker)."""
        w = self._workers.get(worker)
        if w is None:
            return 0
        state = w.tiers[tier]
        return len(state.own_of) - state.aliased

    def copies(self, worker: WorkerKey, engine_hash: EngineHash, tier: int = DEVICE) -> int:
        """Physical copies of an engine block the worker holds (0: none)."""
        w = self._workers.get(worker)
        if w is None or engine_hash not in w.tiers[tier].own_of:
            return 0
        return 1 + w.tiers[tier].copies.get(engine_hash, 0)

    def workers(self) -> list[WorkerKey]:
        return list(self._workers)

    def summary(self, worker: WorkerKey) -> dict[str, object] | None:
        """What the index holds for one worker (for /debug/kv; None: unknown worker)."""
        w = self._workers.get(worker)
        if w is None:
            return None
        device, offloaded = w.tiers
        device_blocks = self.size(worker, DEVICE)
        shared = sum(1 for own in set(device.own_of.values()) if self._masks[DEVICE][own] != w.bit)
        return {
            "device_blocks": device_blocks,
            "offloaded_blocks": self.size(worker, OFFLOADED),
            "engine_hashes": len(device.own_of) + len(offloaded.own_of),
            "extra_copies": sum(device.copies.values()) + sum(offloaded.copies.values()),
            "aliased_hashes": device.aliased + offloaded.aliased,
            "shared_with_other_workers": shared,
            "cache_groups": {str(group): main for group, main in w.groups.items()},
        }

    def holders(self, router_hash: int, tier: int = DEVICE) -> set[WorkerKey]:
        """Workers holding one block (for tests and debugging)."""
        result: dict[WorkerKey, int] = {}
        self._credit(result, self._masks[tier].get(router_hash, 0), 0)
        return set(result)

    def __len__(self) -> int:
        """Distinct device blocks over all workers."""
        return len(self._masks[DEVICE])

    # ---- internals ----------------------------------------------------------------------

    def _worker(self, key: WorkerKey) -> _Worker:
        w = self._workers.get(key)
        if w is None:
            if self._free:
                slot = heapq.heappop(self._free)
                self._slots[slot] = key
            else:
                slot = len(self._slots)
                self._slots.append(key)
            w = self._workers[key] = _Worker(key, slot)
        return w

    def _credit(self, result: dict[WorkerKey, int], bits: int, depth: int) -> None:
        slots = self._slots
        while bits:
            low = bits & -bits
            key = slots[low.bit_length() - 1]
            if key is not None:
                result[key] = depth
            bits ^= low

    def _group_skipped(self, w: _Worker, group: int, kind: str | None, learn: bool) -> bool:
        if kind is not None:
            main = kind in MAIN_ATTENTION_KINDS
            if learn:
                w.groups[group] = main
        else:
            main = w.groups.get(group, True)
        if not main:
            self.counters.skipped_group += 1
        return not main

    def _store(self, w: _Worker, record: Stored) -> None:
        counters = self.counters
        tier = DEVICE
        medium = record.medium
        if (medium is not None and medium != "GPU") or record.locality is not None:
            tier = tier_of(medium, record.locality)
            if tier == SKIP:
                counters.skipped_tier += 1
                return
        if record.ownership is not None and record.ownership.lower() == _RESIDENCY_AGENT:
            counters.skipped_tier += 1
            return
        if record.group_idx is not None and self._group_skipped(
            w, record.group_idx, record.kv_cache_spec_kind, True
        ):
            return
        extra = record.extra_keys
        if (
            record.lora_id is not None
            or record.lora_name is not None
            or (extra and any(keys for keys in extra))
        ):
            counters.skipped_namespace += 1
            return
        engine_hashes = record.block_hashes
        tokens = record.token_ids
        n = len(engine_hashes)
        if n == 0:
            return
        packed = type(tokens) is Raw  # StoredPacked: the msgpack array, hashed from there
        count = token_count(tokens) if packed else len(tokens)  # type: ignore[arg-type]
        size = record.block_size or count // n
        if size <= 0 or count != n * size:
            counters.malformed_stored += 1
            return
        state = w.tiers[tier]
        own_of = state.own_of
        parent = record.parent_block_hash
        if parent is not None:
            found = own_of.get(parent)
            if found is None:  # a chain may continue on another tier (offloaded parents)
                found = w.tiers[1 - tier].own_of.get(parent)
                if found is None:
                    counters.unknown_parent += 1
                    return
            parent = found
        try:
            if packed:
                owns = msgpack_block_hashes(tokens, size, parent)  # type: ignore[arg-type]
            else:
                owns = block_hashes(tokens, size, parent)
        except (TypeError, ValueError):  # token ids that are not u32
            counters.malformed_stored += 1
            return
        masks = self._masks[tier]
        bit = w.bit
        counters.blocks_stored += n
        stored = store_new(own_of, masks, engine_hashes, owns, bit)
        if stored == _DONE:  # the common case, new content
            return
        if stored == _ALIASES:
            get = masks.get
            for own in owns:
                held = get(own, 0)
                if held & bit:  # this worker holds that content under another engine hash
                    state.aliases[own] = state.aliases.get(own, 0) + 1
                    state.aliased += 1
                else:
                    masks[own] = held | bit
            return
        for engine_hash, own in zip(engine_hashes, owns, strict=True):
            previous = own_of.get(engine_hash)
            if previous is not None:
                if previous == own:  # another physical copy of a block already held
                    state.copies[engine_hash] = state.copies.get(engine_hash, 0) + 1
                    counters.duplicate_stores += 1
                    continue
                # The engine reused the id for other content: the old block is gone.
                state.copies.pop(engine_hash, None)
                self._release(state, masks, bit, previous)
            own_of[engine_hash] = own
            held = masks.get(own, 0)
            if held & bit:
                state.aliases[own] = state.aliases.get(own, 0) + 1
                state.aliased += 1
            else:
                masks[own] = held | bit

    def _remove(self, w: _Worker, record: Removed) -> None:
        tier = DEVICE
        if record.medium is not None or record.locality is not None:
            tier = tier_of(record.medium, record.locality)
            if tier == SKIP:
                self.counters.skipped_tier += 1
                return
        if record.group_idx is not None and self._group_skipped(w, record.group_idx, None, False):
            return
        state = w.tiers[tier]
        own_of = state.own_of
        masks = self._masks[tier]
        bit = w.bit
        if not state.copies and not state.aliases:
            # The common case: each engine hash is one block of its own content.
            remove_plain(own_of, masks, record.block_hashes, ~bit)
            return
        copies = state.copies
        for engine_hash in record.block_hashes:
            extra = copies.get(engine_hash)
            if extra is not None:  # one physical copy goes, the block stays
                if extra > 1:
                    copies[engine_hash] = extra - 1
                else:
                    del copies[engine_hash]
                continue
            gone = own_of.pop(engine_hash, None)
            if gone is not None:  # unknown: a block we skipped, or never saw stored
                self._release(state, masks, bit, gone)

    @staticmethod
    def _release(state: _TierState, masks: dict[int, int], bit: int, own: int) -> None:
        """One engine hash naming `own` is gone from the worker."""
        aliases = state.aliases
        count = aliases.get(own)
        if count is not None:  # another engine hash still names it
            state.aliased -= 1
            if count > 1:
                aliases[own] = count - 1
            else:
                del aliases[own]
            return
        mask = masks[own] & ~bit
        if mask:
            masks[own] = mask
        else:
            del masks[own]

    def _clear(self, w: _Worker) -> None:
        keep = ~w.bit
        for state, masks in zip(w.tiers, self._masks, strict=True):
            for own in state.blocks():
                mask = masks[own] & keep
                if mask:
                    masks[own] = mask
                else:
                    del masks[own]
            state.own_of.clear()
            state.copies.clear()
            state.aliases.clear()
            state.aliased = 0
