"""Uniformly random worker."""

from __future__ import annotations

import random
from collections.abc import Sequence

from switchyard.router.types import RouteContext, WorkerView


class RandomChoice:
    name = "random"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, candidates: Sequence[WorkerView], ctx: RouteContext) -> WorkerView:
        return self._rng.choice(candidates)
