"""Scorer: predicted time to first token there, plus the prefill work it adds (the time
model, see `timing`), in seconds; score = the best worker's cost / this worker's cost.

    cost(w) = base + queue(w) + (1 + work_weight) x prefill(w) + decode(w)

So a conversation stays on the worker holding it unless waiting there truly costs more than
recomputing it elsewhere, or the batch it would join there is much larger. Dry runs record
each worker's TTFT, prefill, queue and decode time.
"""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.protos.messages import ROLE_PREFILL
from switchyard.router.prefix import cached_tokens_all
from switchyard.router.types import (
    Explanation,
    Needs,
    NoParams,
    PluginDeps,
    RouteContext,
    Worker,
)


class PredictedTtft:
    name = "predicted_ttft"
    needs = Needs.BLOCKS | Needs.ENGINE_LOAD
    Params = NoParams

    def __init__(self, params: NoParams, deps: PluginDeps) -> None:
        self.time = deps.time

    def costs(self, ctx: RouteContext, workers: Sequence[Worker]) -> list[float]:
        time = self.time
        p = time.params
        offload, work, penalty = p.offload_weight, p.work_weight, p.running_penalty_ms / 1e3
        decode_per_token, output = p.decode_per_token_s, p.output_tokens
        prompt = ctx.prompt_tokens
        explain = ctx.explain
        costs = []
        speed_of = time.speed
        now, stale = ctx.now, ctx.engine_stale_s
        for w, (cached, pending) in zip(
            workers, cached_tokens_all(ctx, workers, offload), strict=True
        ):
            speed = speed_of(w.key, now)
            per_token = speed.slope
            uncached = prompt - cached
            if not w.instance.local_prefill:
                uncached = 0.0  # a decode-only engine receives the KV from a prefill hop
            load = w.load
            queued = load.prefill_tokens
            running = load.in_flight - load.in_prefill
            requests = load.in_flight
            report = w.engine
            if report.at >= 0 and now - report.at <= stale:  # a fresh engine report
                if report.waiting_uncached_tokens is not None:
                    queued = max(queued, report.waiting_uncached_tokens)
                running = max(running, report.running)
                requests = max(requests, report.running + report.waiting)
            queue_s = queued * per_token + running * penalty
            prefill_s = uncached * per_token
            decode_s = (
                decode_per_token * (load.kv_tokens + requests * output)
                if w.instance.role != ROLE_PREFILL  # a prefill engine runs no decode batch
                else 0.0
            )
            ttft = speed.base + queue_s + prefill_s
            costs.append(ttft + work * prefill_s + decode_s)
            if explain:
                ctx.explanations[w.key] = Explanation(
                    ttft, prefill_s, queue_s, int(cached), pending, decode_s
                )
        return costs

    def score(self, ctx: RouteContext, workers: Sequence[Worker]) -> list[float]:
        costs = self.costs(ctx, workers)
        best = min(costs)
        return [best / c if c > 0 else 1.0 for c in costs]
