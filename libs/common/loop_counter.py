"""A Prometheus counter for code that runs on one event loop: no lock per increment.

prometheus-client's Counter takes a mutex on every `inc`; the dispatcher's reply counters are
incremented per flush, which at concurrency 1 is per token. Here `inc` is one addition on a
plain Python number, read by the scrape (on the metrics server's thread) as it is. Exposed
through a custom collector as `<name>_total`, as prometheus-client's Counter names it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class LoopCounter(Collector):
    def __init__(
        self, name: str, documentation: str, registry: CollectorRegistry | None = None
    ) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.value = 0
        if registry is not None:
            registry.register(self)

    def inc(self, amount: int = 1) -> None:
        self.value += amount

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation)

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.value)
