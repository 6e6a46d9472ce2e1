"""Picker: a uniformly random candidate; scores are ignored."""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.router.types import Needs, NoParams, PluginDeps, RouteContext, Worker


class RandomChoice:
    name = "random"
    needs = Needs.NONE
    Params = NoParams

    def __init__(self, params: NoParams, deps: PluginDeps) -> None:
        self._rng = deps.rng

    def pick(self, ctx: RouteContext, workers: Sequence[Worker], totals: Sequence[float]) -> int:
        return self._rng.randrange(len(workers))
