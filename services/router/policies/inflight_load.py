"""Scorer: fewer requests in flight (the router's own bookkeeping) is better; min-max
normalized over the candidates (all equal: 1 for every one)."""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.router.types import Needs, RouteContext, Worker


class InflightLoad:
    name = "inflight_load"
    needs = Needs.NONE

    def score(self, ctx: RouteContext, workers: Sequence[Worker]) -> list[float]:
        loads = [w.load.in_flight for w in workers]
        low, high = min(loads), max(loads)
        if high == low:
            return [1.0] * len(loads)
        span = high - low
        return [(high - x) / span for x in loads]
