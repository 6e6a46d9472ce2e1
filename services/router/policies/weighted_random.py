"""Picker: sampled from softmax(total / temperature) (totals are in [0, sum of weights]), which
spreads load between near-equal workers; temperature -> 0 approaches max_score."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.router.types import Needs, PluginDeps, RouteContext, Worker


@dataclass(frozen=True, slots=True)
class WeightedRandomParams:
    temperature: float = 0.1

    def __post_init__(self) -> None:
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")


class WeightedRandom:
    name = "weighted_random"
    needs = Needs.NONE
    Params = WeightedRandomParams

    def __init__(self, params: WeightedRandomParams, deps: PluginDeps) -> None:
        self.params = params
        self._rng = deps.rng

    def pick(self, ctx: RouteContext, workers: Sequence[Worker], totals: Sequence[float]) -> int:
        best = max(totals)
        t = self.params.temperature
        weights = [math.exp((x - best) / t) for x in totals]
        return self._rng.choices(range(len(workers)), weights)[0]
