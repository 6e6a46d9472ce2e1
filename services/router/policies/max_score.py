"""Picker: the highest weighted score; ties go to the fewest requests in flight, then at
random (so equal workers share the load)."""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.router.types import Needs, NoParams, PluginDeps, RouteContext, Worker

_TIE = 1e-9


class MaxScore:
    name = "max_score"
    needs = Needs.NONE
    Params = NoParams

    def __init__(self, params: NoParams, deps: PluginDeps) -> None:
        self._rng = deps.rng

    def pick(self, ctx: RouteContext, workers: Sequence[Worker], totals: Sequence[float]) -> int:
        best = max(totals)
        tied = [i for i, t in enumerate(totals) if t >= best - _TIE]
        if len(tied) > 1:
            fewest = min(workers[i].load.in_flight for i in tied)
            tied = [i for i in tied if workers[i].load.in_flight == fewest]
        return tied[0] if len(tied) == 1 else self._rng.choice(tied)
