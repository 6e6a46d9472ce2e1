"""Round-robin over the candidates, ordered by instance id so every replica agrees."""

from __future__ import annotations

import random
from collections.abc import Sequence

from switchyard.router.types import RouteContext, WorkerView


class RoundRobin:
    name = "round_robin"

    def __init__(self, rng: random.Random) -> None:
        self._next = 0

    def pick(self, candidates: Sequence[WorkerView], ctx: RouteContext) -> WorkerView:
        ordered = sorted(candidates, key=lambda w: w.instance_id)
        choice = ordered[self._next % len(ordered)]
        self._next += 1
        return choice
