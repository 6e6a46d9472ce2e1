"""Round-robin over the candidates, ordered by instance id so every replica agrees."""

from __future__ import annotations

import random
from collections.abc import Sequence

from switchyard.router.types import Decision, RouteContext, WorkerView


class RoundRobin:
    name = "round_robin"
    needs_overlap = False

    def __init__(self, rng: random.Random) -> None:
        self._next = 0

    def pick(self, candidates: Sequence[WorkerView], ctx: RouteContext) -> Decision:
        ordered = sorted(candidates, key=lambda w: w.instance_id)
        choice = ordered[self._next % len(ordered)]
        self._next += 1
        return Decision(choice, {w.instance_id: float(w.in_flight) for w in candidates})
