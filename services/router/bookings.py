"""Pending bookings: prompt blocks the router sent to a worker that the engine has not
reported storing yet.

The first request of a new prefix books its blocks on its worker at once, before the engine
has prefilled them and published its events; requests sharing the prefix that arrive before
that prefill ends see the booking (and, in the time model, the prefill they would wait for
there), so a burst does not prefill the same prefix on every engine. A booking expires after
`ttl` seconds; by then the engine's own events have told the index.

Layout as the KV index's: router hash -> bitmask of the workers holding a booking of it, so a
lookup is one dict get and one AND per request block; expiry is a single queue in booking
order (one TTL for all), consumed as it comes due.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Sequence

from switchyard.router.types import WorkerKey


class Bookings:
    def __init__(self, ttl: float = 10.0, max_blocks_per_worker: int = 200_000) -> None:
        if not ttl >= 0:
            raise ValueError(f"ttl must be >= 0, got {ttl}")
        if max_blocks_per_worker < 1:
            raise ValueError(f"max_blocks_per_worker must be >= 1, got {max_blocks_per_worker}")
        self.ttl = ttl
        self.max_blocks = max_blocks_per_worker
        self._masks: dict[int, int] = {}
        self._slots: dict[WorkerKey, int] = {}
        self._keys: list[WorkerKey | None] = []
        self._free: list[int] = []
        self._entries: list[dict[int, float]] = []  # slot -> {hash: expiry}, expiry order
        self._due: collections.deque[tuple[float, int, int]] = collections.deque()

    def add(self, worker: WorkerKey, hashes: Sequence[int], now: float) -> None:
        if not hashes or self.ttl == 0:
            return
        slot = self._slot(worker)
        entries = self._entries[slot]
        bit = 1 << slot
        masks = self._masks
        expiry = now + self.ttl
        due = self._due
        for h in hashes:
            if entries.pop(h, None) is None:
                masks[h] = masks.get(h, 0) | bit
            entries[h] = expiry  # re-inserted at the end: the dict stays in expiry order
            due.append((expiry, slot, h))
        while len(entries) > self.max_blocks:
            self._drop(slot, next(iter(entries)))

    def overlaps(self, hashes: Sequence[int], now: float) -> dict[WorkerKey, int]:
        """worker -> leading blocks of `hashes` booked on it (absent when none)."""
        self.expire(now)
        result: dict[WorkerKey, int] = {}
        if not self._masks:
            return result
        get = self._masks.get
        active = -1
        for depth, h in enumerate(hashes):
            matching = active & get(h, 0)
            if matching != active:
                if depth:
                    self._credit(result, active & ~matching, depth)
                if not matching:
                    return result
                active = matching
        if active != -1:
            self._credit(result, active, len(hashes))
        return result

    def expire(self, now: float) -> None:
        due = self._due
        entries = self._entries
        while due and due[0][0] <= now:
            expiry, slot, h = due.popleft()
            if entries[slot].get(h) == expiry:  # not re-booked since
                self._drop(slot, h)

    def drop_instance(self, instance_id: int) -> None:
        for worker in [w for w in self._slots if w[0] == instance_id]:
            slot = self._slots.pop(worker)
            for h in list(self._entries[slot]):
                self._drop(slot, h)
            self._keys[slot] = None
            heapq.heappush(self._free, slot)

    def size(self, worker: WorkerKey) -> int:
        slot = self._slots.get(worker)
        return 0 if slot is None else len(self._entries[slot])

    def _slot(self, worker: WorkerKey) -> int:
        slot = self._slots.get(worker)
        if slot is None:
            if self._free:
                slot = heapq.heappop(self._free)
                self._keys[slot] = worker
                self._entries[slot] = {}
            else:
                slot = len(self._keys)
                self._keys.append(worker)
                self._entries.append({})
            self._slots[worker] = slot
        return slot

    def _drop(self, slot: int, h: int) -> None:
        del self._entries[slot][h]
        mask = self._masks[h] & ~(1 << slot)
        if mask:
            self._masks[h] = mask
        else:
            del self._masks[h]

    def _credit(self, result: dict[WorkerKey, int], bits: int, depth: int) -> None:
        keys = self._keys
        while bits:
            low = bits & -bits
            key = keys[low.bit_length() - 1]
            if key is not None:
                result[key] = depth
            bits ^= low
