"""A Prometheus counter for code that runs on one event loop: no lock per increment.

prometheus-client's Counter takes a mutex on every `inc`; the dispatcher's reply counters are
incremented per flush, which at concurrency 1 is per token. Here `inc` is one addition on a
plain Python number, read by the scrape (on the metrics server's thread) as it is. Exposed
through a custom collector as `<name>_total`, as prometheus-client's Counter names it.
With `labelnames`, `inc_labels(values)` counts the series of one tuple of label values (in
the order of `labelnames`), a dict update; the series appear in the order first counted.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class LoopCounter(Collector):
    def __init__(
        self,
        name: str,
        documentation: str,
        registry: CollectorRegistry | None = None,
        labelnames: Sequence[str] = (),
    ) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.value = 0
        self.by_labels: dict[tuple[str, ...], int] = {}
        if registry is not None:
            registry.register(self)

    def inc(self, amount: int = 1) -> None:
        self.value += amount

    def inc_labels(self, values: tuple[str, ...], amount: int = 1) -> None:
        by_labels = self.by_labels
        by_labels[values] = by_labels.get(values, 0) + amount

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[CounterMetricFamily]:
        if not self.labelnames:
            yield CounterMetricFamily(self.name, self.documentation, value=self.value)
            return
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, count in list(self.by_labels.items()):
            family.add_metric(list(values), count)
        yield family
