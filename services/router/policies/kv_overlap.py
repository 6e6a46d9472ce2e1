"""Scorer: the share of the prompt the worker can serve from its cache (device blocks, booked
blocks, offloaded blocks weighed by `offload_weight`), in [0, 1]."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.router.prefix import cached_tokens_all
from switchyard.router.types import Needs, PluginDeps, RouteContext, Worker


@dataclass(frozen=True, slots=True)
class KvOverlapParams:
    offload_weight: float = 0.8

    def __post_init__(self) -> None:
        if not 0.0 <= self.offload_weight <= 1.0:
            raise ValueError(f"offload_weight must be in [0, 1], got {self.offload_weight}")


class KvOverlap:
    name = "kv_overlap"
    needs = Needs.BLOCKS
    Params = KvOverlapParams

    def __init__(self, params: KvOverlapParams, deps: PluginDeps) -> None:
        self.params = params

    def score(self, ctx: RouteContext, workers: Sequence[Worker]) -> list[float]:
        prompt = max(ctx.prompt_tokens - 1, 1)
        weight = self.params.offload_weight
        return [cached / prompt for cached, _ in cached_tokens_all(ctx, workers, weight)]
