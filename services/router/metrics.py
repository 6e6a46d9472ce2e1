"""The router's Prometheus metrics (served on --metrics-port, default 7290). Decision metrics
are updated per route; KV ingestion counters, index sizes and per-worker load are read at
scrape time (nothing on the ingestion hot path)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from switchyard.protos.messages import Instance
from switchyard.router.kv.index import KvIndex
from switchyard.router.load import InFlightTracker

_LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
_RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)


class _KvCollector(Collector):
    def __init__(
        self,
        index: KvIndex,
        instances: Callable[[], Mapping[int, Instance]],
        tracker: InFlightTracker | None,
    ) -> None:
        self.index = index
        self.instances = instances
        self.tracker = tracker

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        c = self.index.counters
        for name, value, doc in (
            ("kv_events_applied", c.events_applied, "KV events applied to the index"),
            ("kv_replays", c.replays, "replays fetched from engines' replay sockets"),
            ("kv_gaps", c.gaps, "sequence gaps seen on KV event streams"),
            ("kv_resets", c.resets, "KV event streams that restarted (engine restarts)"),
            ("kv_unknown_parent", c.unknown_parent, "stored events skipped: unknown parent"),
            ("kv_decode_errors", c.decode_errors, "undecodable KV event messages"),
        ):
            yield CounterMetricFamily(f"switchyard_router_{name}", doc, value=value)
        known = self.instances()
        sizes = GaugeMetricFamily(
            "switchyard_router_kv_index_blocks",
            "blocks the index holds per worker",
            labels=["instance_id", "model", "worker"],
        )
        for instance_id in self.index.workers():
            instance = known.get(instance_id)
            model, url = (instance.model, instance.url) if instance else ("", "")
            sizes.add_metric([str(instance_id), model, url], self.index.size(instance_id))
        yield sizes
        if self.tracker is None:
            return
        in_flight = GaugeMetricFamily(
            "switchyard_router_worker_in_flight",
            "requests routed to each worker and not finished (the router's own bookkeeping)",
            labels=["model", "worker"],
        )
        active = GaugeMetricFamily(
            "switchyard_router_worker_active_blocks",
            "KV blocks of the requests running on each worker (the router's load estimate)",
            labels=["model", "worker"],
        )
        for instance_id, instance in sorted(known.items()):
            labels = [instance.model, instance.url]
            in_flight.add_metric(labels, self.tracker.in_flight(instance_id))
            active.add_metric(labels, self.tracker.active_blocks(instance_id))
        yield in_flight
        yield active


class RouterMetrics:
    """Label sets: `mode` a routing policy, `model` a served model, `worker` an engine URL
    from fleet's set (bounded by the configured engines)."""

    def __init__(
        self,
        index: KvIndex,
        instances: Callable[[], Mapping[int, Instance]] | None = None,
        tracker: InFlightTracker | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "switchyard_router_decisions",
            "routing decisions",
            ["mode", "model"],
            registry=self.registry,
        )
        self.routed = Counter(
            "switchyard_router_routed",
            "requests routed to each worker",
            ["model", "worker"],
            registry=self.registry,
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
        self.registry.register(_KvCollector(index, instances or dict, tracker))
