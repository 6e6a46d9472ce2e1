"""The router's Prometheus metrics. Decision metrics are updated per route; KV ingestion
counters, index sizes, plugin timings and engine-load figures are read at scrape time
(nothing on the ingestion or routing hot path beyond plain counters)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from switchyard.router.framework import PluginStats
from switchyard.router.kv.index import KvIndex

_LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
_RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Collector(Collector):
    def __init__(
        self,
        index: KvIndex,
        stats: PluginStats | None,
        silent: Callable[[], int] | None,
    ) -> None:
        self.index = index
        self.stats = stats
        self.silent = silent

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        c = self.index.counters
        for name, doc in (
            ("events_applied", "KV events applied to the index"),
            ("blocks_stored", "blocks of BlockStored events applied"),
            ("replays", "replays fetched from engines' replay sockets"),
            ("gaps", "sequence gaps seen on KV event streams"),
            ("resets", "KV event streams that restarted (engine restarts)"),
            ("unknown_parent", "stored events skipped: unknown parent"),
            ("decode_errors", "undecodable KV event messages"),
            ("unknown_topic", "KV event messages whose topic names no known worker"),
            ("duplicate_stores", "second physical copies of a block (vLLM repeats)"),
            ("skipped_group", "events of sliding-window / state-space cache groups"),
            ("replay_failures", "missed KV batches that could not be replayed"),
        ):
            yield CounterMetricFamily(f"switchyard_router_kv_{name}", doc, value=getattr(c, name))
        sizes = GaugeMetricFamily(
            "switchyard_router_kv_index_blocks",
            "blocks the index holds per worker (device tier)",
            labels=["instance_id", "dp_rank"],
        )
        for instance_id, rank in self.index.workers():
            sizes.add_metric([str(instance_id), str(rank)], self.index.size((instance_id, rank)))
        yield sizes
        if self.silent is not None:
            yield GaugeMetricFamily(
                "switchyard_router_kv_silent_workers",
                "instances routed to whose KV events never arrived",
                value=self.silent(),
            )
        if self.stats is not None:
            seconds = CounterMetricFamily(
                "switchyard_router_plugin_seconds",
                "time spent in each routing plugin",
                labels=["plugin"],
            )
            calls = CounterMetricFamily(
                "switchyard_router_plugin_calls", "routing plugin calls", labels=["plugin"]
            )
            clamped = CounterMetricFamily(
                "switchyard_router_plugin_clamped",
                "scores outside [0, 1] (or NaN) the framework clamped",
                labels=["plugin"],
            )
            for name, stat in self.stats.by_plugin.items():
                seconds.add_metric([name], stat.seconds)
                calls.add_metric([name], stat.calls)
                clamped.add_metric([name], stat.clamped)
            yield seconds
            yield calls
            yield clamped


class RouterMetrics:
    def __init__(
        self,
        index: KvIndex,
        stats: PluginStats | None = None,
        silent: Callable[[], int] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "switchyard_router_decisions", "routing decisions", ["mode"], registry=self.registry
        )
        self.latency = Histogram(
            "switchyard_router_decision_seconds",
            "time to take one routing decision",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.hit_ratio = Histogram(
            "switchyard_router_predicted_hit_ratio",
            "overlap blocks / prompt blocks of the chosen worker",
            buckets=_RATIO_BUCKETS,
            registry=self.registry,
        )
        self.predicted_ttft = Histogram(
            "switchyard_router_predicted_ttft_seconds",
            "the chosen worker's predicted time to first token",
            buckets=_TTFT_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Collector(index, stats, silent))
