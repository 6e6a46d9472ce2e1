"""In-flight bookkeeping per worker: added on route, prefill done at the first token, freed at
the end. A notice that never comes (a preprocessor died) expires after `ttl` seconds.

Besides request counts it keeps KV-block sums for the KV policy: blocks still to prefill
(cleared at the first token) and blocks held by every in-flight request.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    instance_id: int
    deadline: float
    prefill_blocks: int
    blocks: int
    prefilling: bool = True


class InFlightTracker:
    def __init__(self, ttl: float = 600.0) -> None:
        self.ttl = ttl
        self._requests: dict[str, _Entry] = {}
        self._in_flight: dict[int, int] = {}
        self._in_prefill: dict[int, int] = {}
        self._prefill_blocks: dict[int, int] = {}
        self._active_blocks: dict[int, int] = {}

    def in_flight(self, instance_id: int) -> int:
        return self._in_flight.get(instance_id, 0)

    def in_prefill(self, instance_id: int) -> int:
        return self._in_prefill.get(instance_id, 0)

    def prefill_blocks(self, instance_id: int) -> int:
        return self._prefill_blocks.get(instance_id, 0)

    def active_blocks(self, instance_id: int) -> int:
        return self._active_blocks.get(instance_id, 0)

    def __len__(self) -> int:
        return len(self._requests)

    def add(
        self,
        request_id: str,
        instance_id: int,
        now: float,
        prefill_blocks: int = 0,
        blocks: int = 0,
    ) -> None:
        self.finish(request_id)  # a re-route (migration) replaces the old placement
        self._requests[request_id] = _Entry(instance_id, now + self.ttl, prefill_blocks, blocks)
        self._bump(self._in_flight, instance_id, 1)
        self._bump(self._in_prefill, instance_id, 1)
        self._bump(self._prefill_blocks, instance_id, prefill_blocks)
        self._bump(self._active_blocks, instance_id, blocks)

    def first_token(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is not None and entry.prefilling:
            entry.prefilling = False
            self._bump(self._in_prefill, entry.instance_id, -1)
            self._bump(self._prefill_blocks, entry.instance_id, -entry.prefill_blocks)

    def finish(self, request_id: str) -> None:
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        self._bump(self._in_flight, entry.instance_id, -1)
        self._bump(self._active_blocks, entry.instance_id, -entry.blocks)
        if entry.prefilling:
            self._bump(self._in_prefill, entry.instance_id, -1)
            self._bump(self._prefill_blocks, entry.instance_id, -entry.prefill_blocks)

    def drop_instance(self, instance_id: int) -> None:
        for request_id in [r for r, e in self._requests.items() if e.instance_id == instance_id]:
            self.finish(request_id)
        for sums in (self._in_flight, self._in_prefill, self._prefill_blocks, self._active_blocks):
            sums.pop(instance_id, None)

    def expire(self, now: float) -> int:
        stale = [r for r, e in self._requests.items() if e.deadline <= now]
        for request_id in stale:
            self.finish(request_id)
        return len(stale)

    @staticmethod
    def _bump(sums: dict[int, int], instance_id: int, delta: int) -> None:
        sums[instance_id] = sums.get(instance_id, 0) + delta
