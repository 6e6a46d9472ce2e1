"""Pending bookings: prompt blocks the router sent to a worker that the engine has not
reported storing yet.

The first request of a new prefix books its blocks on its worker at once, before the engine
has prefilled them and published its events; requests sharing the prefix that arrive before
that prefill ends see the booking (and, in the time model, the prefill they would wait for
there), so a burst does not prefill the same prefix on every engine. A booking expires after
`ttl` seconds; by then the engine's own events have told the index. Only what the worker
does not already hold or have booked is booked (`add(..., start)`), so a conversation's next
turn books its new blocks only.

Layout: the masks live in the KV index's bit space (router hash -> bitmask of the workers
with a booking of it), so the index walks device blocks and bookings in one pass
(`KvIndex.overlaps_with`); expiry is a single queue in booking order (one TTL for all),
consumed as it comes due.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from switchyard.router.kv.index import KvIndex
from switchyard.router.types import WorkerKey


class Bookings:
    def __init__(
        self, index: KvIndex, ttl: float = 10.0, max_blocks_per_worker: int = 200_000
    ) -> None:
        if not ttl >= 0:
            raise ValueError(f"ttl must be >= 0, got {ttl}")
        if max_blocks_per_worker < 1:
            raise ValueError(f"max_blocks_per_worker must be >= 1, got {max_blocks_per_worker}")
        self.index = index
        self.ttl = ttl
        self.max_blocks = max_blocks_per_worker
        self.masks: dict[int, int] = {}
        self._entries: dict[WorkerKey, dict[int, float]] = {}  # worker -> {hash: expiry}
        self._bits: dict[WorkerKey, int] = {}
        self._due: collections.deque[tuple[float, WorkerKey, int]] = collections.deque()

    def add(self, worker: WorkerKey, hashes: Sequence[int], now: float, start: int = 0) -> None:
        """Book hashes[start:] on the worker (hashes[:start] are held or booked already)."""
        if start >= len(hashes) or self.ttl == 0:
            return
        entries = self._entries.get(worker)
        if entries is None:
            entries = self._entries[worker] = {}
            self._bits[worker] = self.index.bit(worker)
        bit = self._bits[worker]
        masks = self.masks
        expiry = now + self.ttl
        due = self._due
        for i in range(start, len(hashes)):
            h = hashes[i]
            if entries.pop(h, None) is None:
                masks[h] = masks.get(h, 0) | bit
            entries[h] = expiry  # re-inserted at the end: the dict stays in expiry order
            due.append((expiry, worker, h))
        while len(entries) > self.max_blocks:
            self._drop(worker, next(iter(entries)))

    def overlaps(self, hashes: Sequence[int], now: float) -> dict[WorkerKey, int]:
        """worker -> leading blocks of `hashes` held on the device or booked there."""
        self.expire(now)
        return self.index.overlaps_with(hashes, self.masks)

    def expire(self, now: float) -> None:
        due = self._due
        while due and due[0][0] <= now:
            expiry, worker, h = due.popleft()
            entries = self._entries.get(worker)
            if entries is not None and entries.get(h) == expiry:  # not re-booked since
                self._drop(worker, h)

    def drop_instance(self, instance_id: int) -> None:
        for worker in [w for w in self._entries if w[0] == instance_id]:
            for h in list(self._entries[worker]):
                self._drop(worker, h)
            del self._entries[worker]
            del self._bits[worker]

    def size(self, worker: WorkerKey) -> int:
        return len(self._entries.get(worker, ()))

    def _drop(self, worker: WorkerKey, h: int) -> None:
        del self._entries[worker][h]
        mask = self.masks[h] & ~self._bits[worker]
        if mask:
            self.masks[h] = mask
        else:
            del self.masks[h]
