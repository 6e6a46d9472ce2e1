"""Picker: the candidates in turn, ordered by (instance id, rank) so every replica agrees;
scores are ignored. A dry run (/debug/route) shows the next turn without taking it."""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.router.types import Needs, NoParams, PluginDeps, RouteContext, Worker


class RoundRobin:
    name = "round_robin"
    needs = Needs.NONE
    Params = NoParams

    def __init__(self, params: NoParams | None = None, deps: PluginDeps | None = None) -> None:
        self._next = 0

    def pick(self, ctx: RouteContext, workers: Sequence[Worker], totals: Sequence[float]) -> int:
        order = sorted(range(len(workers)), key=lambda i: workers[i].key)
        choice = order[self._next % len(order)]
        if not ctx.request.dry_run:
            self._next += 1
        return choice
