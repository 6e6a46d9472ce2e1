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

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        full = self.params.kv_full
        now, stale = ctx.now, ctx.engine_stale_s
        room = []
        for w in workers:
            engine = w.engine
            window = engine.max_running or w.instance.max_running_requests
            in_flight = w.load.in_flight
            if engine.at >= 0 and now - engine.at <= stale:  # a fresh report
                if engine.waiting > 0 and engine.kv_usage >= full:
                    continue
                running = engine.running + engine.waiting
                if in_flight > running:
                    running = in_flight
            else:
                running = in_flight
            if window <= 0 or running < window:
                room.append(w)
        return room if room else workers
