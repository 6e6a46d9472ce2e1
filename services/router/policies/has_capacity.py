"""Filter: skip a worker at capacity while another has room.

At capacity: its running requests fill its admission window (max running requests) with a
queue behind them, or its KV pool is full (`kv_full`, a fraction) with a queue. Running and
waiting come from the engine's own fresh report, else from the router's own bookkeeping
(requests in flight count as running). When every worker is at capacity, all stay: the
scorers then pick the least bad one.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.router.types import Needs, PluginDeps, RouteContext, Worker


@dataclass(frozen=True, slots=True)
class HasCapacityParams:
    kv_full: float = 0.98

    def __post_init__(self) -> None:
        if not 0.0 < self.kv_full <= 1.0:
            raise ValueError(f"kv_full must be in (0, 1], got {self.kv_full}")


class HasCapacity:
    name = "has_capacity"
    needs = Needs.ENGINE_LOAD
    Params = HasCapacityParams

    def __init__(self, params: HasCapacityParams, deps: PluginDeps) -> None:
        self.params = params

    def at_capacity(self, ctx: RouteContext, w: Worker) -> bool:
        window = w.max_running()
        report = ctx.engine_report(w)
        if report is not None:
            queued = report.waiting > 0
            if report.kv_usage >= self.params.kv_full and queued:
                return True
            running = max(report.running + report.waiting, w.load.in_flight)
        else:
            running = w.load.in_flight
        return window > 0 and running >= window

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        room = [w for w in workers if not self.at_capacity(ctx, w)]
        return room if room else workers
