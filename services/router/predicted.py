"""Blocks the router expects a worker to hold soon.

A routed request's prompt blocks are credited to the chosen worker at once, before the engine
has prefilled them and published its events: otherwise a burst of requests sharing a new
prefix scatters over every worker (each sees no overlap anywhere yet), and each worker
prefills the same prefix. Entries expire after `ttl` seconds; by then the engine's own events
have told the real index.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class PredictedPrefixes:
    def __init__(self, ttl: float = 10.0, max_blocks_per_worker: int = 200_000) -> None:
        if ttl < 0:
            raise ValueError(f"ttl must be >= 0, got {ttl}")
        self.ttl = ttl
        self.max_blocks = max_blocks_per_worker
        # instance id -> {block hash: expiry}, in insertion (so expiry) order
        self._blocks: dict[int, dict[int, float]] = {}

    def add(self, instance_id: int, hashes: Sequence[int], now: float) -> None:
        if not hashes or self.ttl == 0:
            return
        blocks = self._blocks.setdefault(instance_id, {})
        expiry = now + self.ttl
        for h in hashes:
            blocks.pop(h, None)  # re-insert at the end: keeps the dict in expiry order
            blocks[h] = expiry
        while len(blocks) > self.max_blocks:
            del blocks[next(iter(blocks))]

    def overlaps(
        self, hashes: Sequence[int], instance_ids: Iterable[int], now: float
    ) -> dict[int, int]:
        """instance id -> leading blocks of `hashes` predicted on it (absent when none)."""
        result: dict[int, int] = {}
        if not hashes:
            return result
        first = hashes[0]
        for instance_id in instance_ids:
            blocks = self._blocks.get(instance_id)
            if not blocks:
                continue
            self._expire(blocks, now)
            if blocks.get(first, 0.0) <= now:
                continue
            depth = 0
            for h in hashes:
                if blocks.get(h, 0.0) <= now:
                    break
                depth += 1
            result[instance_id] = depth
        return result

    def drop_instance(self, instance_id: int) -> None:
        self._blocks.pop(instance_id, None)

    def size(self, instance_id: int) -> int:
        return len(self._blocks.get(instance_id, ()))

    @staticmethod
    def _expire(blocks: dict[int, float], now: float) -> None:
        while blocks:
            oldest = next(iter(blocks))
            if blocks[oldest] > now:
                return
            del blocks[oldest]
