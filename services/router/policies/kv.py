"""KV-aware: the worker where this request costs least, counting the prefill it would still
have to compute there (its uncached blocks plus prefills already queued) and the decode work
in flight.

    cost(w) = overlap_weight x (prompt_blocks - overlap(w) + pending_prefill_blocks(w))
              + active_blocks(w)

Lowest cost wins; ties go to the lower in-flight count, then at random. With a temperature
above 0 the choice is sampled from softmax(-cost / temperature) (costs normalized by the
largest), which spreads load between near-equal workers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.router.types import Decision, RouteContext, WorkerView


@dataclass(frozen=True)
class KvParams:
    overlap_weight: float = 1.0
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if not (self.overlap_weight >= 0 and math.isfinite(self.overlap_weight)):
            raise ValueError(
                f"overlap weight must be a finite number >= 0, got {self.overlap_weight}"
            )
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")


class KvAware:
    name = "kv"
    needs_overlap = True

    def __init__(self, rng: random.Random, params: KvParams | None = None) -> None:
        self._rng = rng
        self.params = params or KvParams()

    def cost(self, w: WorkerView, ctx: RouteContext) -> float:
        prefill = ctx.prompt_blocks - w.overlap_blocks + w.pending_prefill_blocks
        return self.params.overlap_weight * prefill + w.active_blocks

    def pick(self, candidates: Sequence[WorkerView], ctx: RouteContext) -> Decision:
        costs = {w.instance_id: self.cost(w, ctx) for w in candidates}
        if self.params.temperature > 0:
            return Decision(self._sample(candidates, costs), costs)
        best = min(costs.values())
        tied = [w for w in candidates if costs[w.instance_id] == best]
        if len(tied) > 1:
            fewest = min(w.in_flight for w in tied)
            tied = [w for w in tied if w.in_flight == fewest]
        return Decision(self._rng.choice(tied), costs)

    def _sample(self, candidates: Sequence[WorkerView], costs: dict[int, float]) -> WorkerView:
        scale = max(max(costs.values()), 1.0)
        best = min(costs.values())
        weights = [
            math.exp(-(costs[w.instance_id] - best) / scale / self.params.temperature)
            for w in candidates
        ]
        return self._rng.choices(candidates, weights)[0]
