"""The mock engine's Prometheus metrics (`--metrics-port`): what tests and benchmarks running it
as a process read, such as how many requests the engine was asked to abort.

Read from the engine's own counters at scrape time (a custom collector): nothing is counted on
the per-token path for it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from switchyard.common.metrics import service_registry
from switchyard.mock_engine.data_parallel import DataParallelEngine

PREFIX = "switchyard_mock_engine"


class _EngineCollector(Collector):
    def __init__(self, engine: DataParallelEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        engine = self._engine
        yield CounterMetricFamily(
            f"{PREFIX}_requests", "Generate requests started", value=engine.total_requests
        )
        yield CounterMetricFamily(
            f"{PREFIX}_aborts",
            "requests ended unfinished by their caller (Abort, or a cancelled call)",
            value=engine.aborts,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_generated_tokens", "tokens generated", value=engine.tokens_generated
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_running_requests", "requests running now", value=engine.active_requests
        )


def engine_registry(engine: DataParallelEngine) -> CollectorRegistry:
    registry = service_registry("mock-engine")
    registry.register(_EngineCollector(engine))
    return registry
