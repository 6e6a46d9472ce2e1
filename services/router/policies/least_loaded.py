"""Fewest in-flight requests; ties broken at random so equal workers share the load."""

from __future__ import annotations

import random
from collections.abc import Sequence

from switchyard.router.types import Decision, RouteContext, WorkerView


class LeastLoaded:
    name = "least_loaded"
    needs_overlap = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, candidates: Sequence[WorkerView], ctx: RouteContext) -> Decision:
        lowest = min(w.in_flight for w in candidates)
        choice = self._rng.choice([w for w in candidates if w.in_flight == lowest])
        return Decision(choice, {w.instance_id: float(w.in_flight) for w in candidates})
