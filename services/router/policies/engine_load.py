"""Scorer: the engine's own load report, lower is better: running and waiting requests as a
share of its admission window, plus its KV usage; min-max normalized over the candidates. A
worker without a fresh report is judged by the router's own in-flight count instead."""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.router.types import Needs, RouteContext, Worker


class EngineLoadScorer:
    name = "engine_load"
    needs = Needs.ENGINE_LOAD

    def score(self, ctx: RouteContext, workers: Sequence[Worker]) -> list[float]:
        loads = []
        for w in workers:
            window = max(w.max_running(), 1)
            report = ctx.engine_report(w)
            if report is None:
                loads.append(w.load.in_flight / window)
            else:
                busy = max(report.running + report.waiting, w.load.in_flight)
                loads.append(busy / window + report.kv_usage)
        low, high = min(loads), max(loads)
        if high - low <= 1e-12:
            return [1.0] * len(loads)
        span = high - low
        return [(high - x) / span for x in loads]
