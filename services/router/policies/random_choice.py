"""Uniformly random worker."""

from __future__ import annotations

import random
from collections.abc import Sequence

from switchyard.router.types import Decision, RouteContext, WorkerView


class RandomChoice:
    name = "random"
    needs_overlap = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, candidates: Sequence[WorkerView], ctx: RouteContext) -> Decision:
        choice = self._rng.choice(candidates)
        return Decision(choice, {w.instance_id: float(w.in_flight) for w in candidates})
