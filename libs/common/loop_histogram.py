"""A Prometheus histogram for code that runs on one event loop: no lock per observation.

prometheus-client's Histogram takes a mutex on every `observe`, which the per-token path pays
per delta. Here an observation is a bisect and two additions on plain Python numbers; a
scrape (on the metrics server's thread) reads them as they are: a count and its sum may be
one observation apart, which Prometheus rates tolerate. Exposed through a custom collector,
so the series look exactly like prometheus-client's (`_bucket{le=...}`, `_sum`, `_count`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector


class HistogramSeries:
    """One label combination: `observe` is the hot-path call."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value


class LoopHistogram(Collector):
    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        labelnames: Sequence[str] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        bounds = tuple(sorted(float(b) for b in buckets if b != float("inf")))
        if not bounds:
            raise ValueError("a histogram needs at least one finite bucket")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = bounds
        self._series: dict[tuple[str, ...], HistogramSeries] = {}
        if not self.labelnames:
            self._default = self.labels()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> HistogramSeries:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = HistogramSeries(self._bounds)
        return series

    def observe(self, value: float) -> None:
        self._default.observe(value)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        edges = [_le(b) for b in self._bounds] + ["+Inf"]
        for values, series in list(self._series.items()):
            counts = list(series.counts)
            cumulative, running = [], 0
            for edge, count in zip(edges, counts, strict=True):
                running += count
                cumulative.append((edge, running))
            family.add_metric(list(values), cumulative, series.sum)
        yield family


def _le(bound: float) -> str:
    return repr(float(bound))
