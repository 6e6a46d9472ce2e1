"""The routing framework: a profile runs filters -> weighted scorers -> picker over workers.

- Filters run in order; each keeps a subset. One that leaves nothing ends the decision, and
  the outcome names it (`emptied_by`), so the core can answer "all busy" or "no worker".
- Scorers each return one score per remaining worker; the framework clamps every score to
  [0, 1] (a NaN counts as 0; both are counted as `clamped`), multiplies by the scorer's
  weight and sums per worker.
- The picker chooses from the totals.
- Every plugin call is timed here (`PluginStats`, exported as metrics); plugins never time
  themselves. Dry runs keep each worker's per-plugin scores and the filter that removed it.

Profiles are built once from validated config (see `config`, `policies.build_profile`); the
hot path allocates one list per scorer and nothing per worker beyond the totals.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import add, mul

from switchyard.router.types import (
    Filter,
    Needs,
    Observer,
    Picker,
    RouteContext,
    Scorer,
    Worker,
    WorkerKey,
)

_clock_ns = time.perf_counter_ns


@dataclass(slots=True)
class PluginStat:
    calls: int = 0
    seconds: float = 0.0
    clamped: int = 0


class PluginStats:
    """Per plugin: calls, total seconds, clamped scores (read by the metrics at scrape)."""

    def __init__(self) -> None:
        self.by_plugin: dict[str, PluginStat] = {}

    def stat(self, key: str) -> PluginStat:
        stat = self.by_plugin.get(key)
        if stat is None:
            stat = self.by_plugin[key] = PluginStat()
        return stat


@dataclass(slots=True)
class Outcome:
    chosen: Worker | None
    workers: list[Worker]  # the candidates that passed every filter
    totals: list[float]
    emptied_by: str = ""  # the filter that left no candidate
    scores: dict[str, list[float]] = field(default_factory=dict)  # dry runs: clamped scores
    filtered: dict[WorkerKey, str] = field(default_factory=dict)  # dry runs: removed by


class Profile:
    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
        stats: PluginStats | None = None,
    ) -> None:
        self.name = name
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker
        self.stats = stats if stats is not None else PluginStats()
        needs = picker.needs
        plugins: list[Filter | Scorer] = [*self.filters, *(s for s, _ in self.scorers)]
        for plugin in plugins:
            needs |= plugin.needs
        self.needs: Needs = needs
        self.observers: list[Observer] = [
            p  # type: ignore[misc]
            for p in [*self.filters, *(s for s, _ in self.scorers), picker]
            if callable(getattr(p, "observe", None))
        ]
        self._filter_stats = [self.stats.stat(f"{name}/{f.name}") for f in self.filters]
        self._scorer_stats = [self.stats.stat(f"{name}/{s.name}") for s, _ in self.scorers]
        self._picker_stat = self.stats.stat(f"{name}/{picker.name}")

    def describe(self) -> str:
        scorers = ", ".join(f"{s.name}x{w:g}" for s, w in self.scorers) or "none"
        filters = ", ".join(f.name for f in self.filters) or "none"
        return f"{self.name}: filters [{filters}] scorers [{scorers}] picker {self.picker.name}"

    def run(self, ctx: RouteContext, workers: list[Worker]) -> Outcome:
        explain = ctx.explain
        filtered: dict[WorkerKey, str] = {}
        for plugin, stat in zip(self.filters, self._filter_stats, strict=True):
            started = _clock_ns()
            kept = plugin.filter(ctx, workers)
            stat.seconds += (_clock_ns() - started) / 1e9
            stat.calls += 1
            if explain and len(kept) != len(workers):
                remaining = {id(w) for w in kept}
                for w in workers:
                    if id(w) not in remaining:
                        filtered[w.key] = plugin.name
            workers = kept
            if not workers:
                return Outcome(None, [], [], plugin.name, filtered=filtered)
        n = len(workers)
        totals = [0.0] * n
        kept_scores: dict[str, list[float]] = {}
        for (scorer, weight), stat in zip(self.scorers, self._scorer_stats, strict=True):
            started = _clock_ns()
            raw = scorer.score(ctx, workers)
            stat.seconds += (_clock_ns() - started) / 1e9
            stat.calls += 1
            if len(raw) != n:
                raise ValueError(f"scorer {scorer.name} returned {len(raw)} scores for {n}")
            total = sum(raw)
            if n and total == total and min(raw) >= 0.0 and max(raw) <= 1.0:
                # All in range, no NaN (a NaN makes the sum NaN): the sums in C, not per
                # worker in Python (the same products and sums, so the same totals).
                clamped = raw  # type: ignore[assignment]
                totals = list(map(add, totals, map(mul, raw, repeat(weight))))
            else:
                clamped = list(raw)
                for i, value in enumerate(clamped):
                    if not 0.0 <= value <= 1.0:  # NaN fails both comparisons
                        clamped[i] = min(max(value, 0.0), 1.0) if value == value else 0.0
                        stat.clamped += 1
                    totals[i] += weight * clamped[i]
            if explain:
                kept_scores[scorer.name] = list(clamped)
        started = _clock_ns()
        index = self.picker.pick(ctx, workers, totals)
        self._picker_stat.seconds += (_clock_ns() - started) / 1e9
        self._picker_stat.calls += 1
        return Outcome(workers[index], workers, totals, scores=kept_scores, filtered=filtered)

    def observe(self, ctx: RouteContext, chosen: Worker) -> None:
        """Tell the plugins that learn from outcomes what was chosen (not for dry runs)."""
        for plugin in self.observers:
            plugin.observe(ctx, chosen)
