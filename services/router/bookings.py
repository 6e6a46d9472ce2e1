"""Pending bookings: prompts the router sent to a worker whose blocks the engine has not
reported storing yet.

The first request of a new prefix books its prompt's blocks on its worker at once, before the
engine has prefilled them and published its events; requests sharing the prefix that arrive
before that prefill ends see the booking (and, in the time model, the prefill they would wait
for there), so a burst does not prefill the same prefix on every engine. A booking expires
after `ttl` seconds; by then the engine's own events have told the index.

Layout, for a cheap hot path: a booking is a byte string with one fixed-size unit per block,
filed under its first block's hash, the unit size and its worker. The core books the
prompt's token bytes themselves (`add_blocks`; two prompts share their first k chained block
hashes exactly when they share their first k blocks of tokens), so booking needs no hash
beyond the first and costs nothing but a reference to bytes the prompt's hashing already
made; `add` books hashes packed 8 bytes per block. A lookup compares the request's bytes with
the few bookings filed under its first block (a binary search of memcmp prefix tests). Per
(first block, worker) only the `per_worker` most recent bookings are kept, and a booking that
extends an older one (a conversation's next turn) replaces it. Expiry is one queue in booking
order (one TTL).
"""

from __future__ import annotations

import collections
from array import array
from collections.abc import Sequence

from switchyard.router.types import WorkerKey


def pack(hashes: Sequence[int]) -> bytes:
    return array("Q", hashes).tobytes()


def common_prefix(
    a: bytes, b: bytes, unit: int = 8, known: int = 0, limit: int | None = None
) -> int:
    """How many leading units (8 bytes: packed hashes; a block's token bytes) two byte
    strings share: `known` of them known equal, at most `limit` (default: all of the
    shorter)."""
    low, high = known, min(len(a), len(b)) // unit if limit is None else limit
    view = memoryview(b)
    while low < high:
        mid = (low + high + 1) // 2
        # memcmp of the units not known equal yet only (no copy): the search compares
        # about the common prefix once, not once per probe
        if a.startswith(view[low * unit : mid * unit], low * unit):
            low = mid
        else:
            high = mid - 1
    return low


class Bookings:
    def __init__(self, ttl: float = 10.0, per_worker: int = 4) -> None:
        if not ttl >= 0:
            raise ValueError(f"ttl must be >= 0, got {ttl}")
        if per_worker < 1:
            raise ValueError(f"per_worker must be >= 1, got {per_worker}")
        self.ttl = ttl
        self.per_worker = per_worker
        # (first block hash, unit) -> worker -> [(packed, expiry)], most recent first
        self._filed: dict[tuple[int, int], dict[WorkerKey, list[tuple[bytes, float]]]] = {}
        self._due: collections.deque[tuple[float, tuple[int, int], WorkerKey, bytes]] = (
            collections.deque()
        )

    def __bool__(self) -> bool:
        return bool(self._filed)

    def add(self, worker: WorkerKey, hashes: Sequence[int], now: float) -> None:
        if hashes and self.ttl:
            self.add_blocks(worker, hashes[0], pack(hashes), 8, now)

    def add_blocks(
        self, worker: WorkerKey, first: int, blocks: bytes, unit: int, now: float
    ) -> None:
        """Book a prompt given as `unit` bytes per block (its token bytes, or packed hashes),
        `first` the hash of its first block."""
        if not blocks or self.ttl == 0:
            return
        expiry = now + self.ttl
        key = (first, unit)
        by_worker = self._filed.setdefault(key, {})
        filed = by_worker.setdefault(worker, [])
        # Drop what this booking covers: an older prompt it extends, the same prompt again.
        filed[:] = [(h, e) for h, e in filed if not blocks.startswith(h)][: self.per_worker - 1]
        filed.insert(0, (blocks, expiry))
        self._due.append((expiry, key, worker, blocks))

    def overlaps(self, hashes: Sequence[int], now: float) -> dict[WorkerKey, int]:
        """worker -> leading blocks of `hashes` booked on it (absent when none)."""
        if not hashes:
            self.expire(now)
            return {}
        return self.overlaps_blocks(hashes[0], None, 8, now, hashes)

    def overlaps_blocks(
        self,
        first: int,
        blocks: bytes | None,
        unit: int,
        now: float,
        hashes: Sequence[int] = (),
    ) -> dict[WorkerKey, int]:
        """worker -> leading blocks of a prompt (as in `add_blocks`; None: pack `hashes`)
        booked on it (absent when none)."""
        self.expire(now)
        result: dict[WorkerKey, int] = {}
        by_worker = self._filed.get((first, unit))
        if not by_worker:
            return result
        packed = pack(hashes) if blocks is None else blocks
        # Bookings under one first block (a chat template's) mostly part at the second: that
        # case is told by one startswith each, without the search.
        one, two = packed[:unit], packed[: 2 * unit]
        for worker, filed in by_worker.items():
            best = 0
            for booked, _ in filed:
                if booked.startswith(two):
                    depth = common_prefix(packed, booked, unit)
                else:
                    depth = 1 if booked.startswith(one) else 0
                if depth > best:
                    best = depth
            result[worker] = best
        return result

    def expire(self, now: float) -> None:
        due = self._due
        while due and due[0][0] <= now:
            expiry, key, worker, packed = due.popleft()
            by_worker = self._filed.get(key)
            if by_worker is None:
                continue
            filed = by_worker.get(worker)
            if filed is None:
                continue
            filed[:] = [(h, e) for h, e in filed if not (h is packed and e == expiry)]
            if not filed:
                del by_worker[worker]
                if not by_worker:
                    del self._filed[key]

    def drop_instance(self, instance_id: int) -> None:
        for first in list(self._filed):
            by_worker = self._filed[first]
            for worker in [w for w in by_worker if w[0] == instance_id]:
                del by_worker[worker]
            if not by_worker:
                del self._filed[first]

    def size(self, worker: WorkerKey) -> int:
        """Bookings held for a worker."""
        return sum(len(by_worker.get(worker, ())) for by_worker in self._filed.values())
