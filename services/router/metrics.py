"""The router's Prometheus metrics (served on --metrics-port, default 7290). Decision metrics
are updated per route; KV ingestion counters, index sizes, plugin timings and per-worker load
are read at scrape time (nothing on the ingestion or routing hot path beyond plain counters).
The decision metrics are LoopHistograms and LoopCounters: the router updates them on its
event loop only, and prometheus-client's took a lock per update (five per decision).

Label sets: `mode` a routing policy, `model` a served model, `worker` an engine URL from
fleet's set, `dp_rank` a data-parallel rank, `plugin` a configured routing plugin (all
bounded by the configuration)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from switchyard.common.loop_counter import LoopCounter
from switchyard.common.loop_histogram import LoopHistogram
from switchyard.common.metrics import service_registry
from switchyard.protos.messages import Instance
from switchyard.router.framework import PluginStats
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.types import WorkerKey, WorkerKvStats
from switchyard.router.load import InFlightTracker

_LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
_RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


KvWorkers = Callable[[], list[tuple[WorkerKey, WorkerKvStats]]]


class _Collector(Collector):
    def __init__(
        self,
        index: KvIndex,
        stats: PluginStats | None,
        silent: Callable[[], int] | None,
        instances: Callable[[], Mapping[int, Instance]],
        tracker: InFlightTracker | None,
        kv_workers: KvWorkers | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.stats = stats
        self.silent = silent
        self.instances = instances
        self.tracker = tracker
        self.kv_workers = kv_workers
        self.clock = clock

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
            ("reconnects", "KV event transports (re)connected: each a catch-up replay"),
            ("publisher_restarts", "catch-ups that found the publisher restarted"),
            ("pre_admission_stores", "stores stamped before the engine's admission, not indexed"),
            ("stale_suspicions", "workers whose KV events stopped while requests ran there"),
        ):
            yield CounterMetricFamily(f"switchyard_router_kv_{name}", doc, value=getattr(c, name))
        known = self.instances()
        sizes = GaugeMetricFamily(
            "switchyard_router_kv_index_blocks",
            "blocks the index holds per worker (device tier)",
            labels=["instance_id", "dp_rank", "model", "worker"],
        )
        # Every known worker's ranks, 0 where the index holds nothing: a (re)admitted engine
        # shows its empty entry instead of no series at all.
        keys = set(self.index.workers())
        keys.update((i, rank) for i, inst in known.items() for rank in range(inst.dp_size))
        for instance_id, rank in sorted(keys):
            instance = known.get(instance_id)
            model, url = (instance.model, instance.url) if instance else ("", "")
            size = self.index.size((instance_id, rank))
            sizes.add_metric([str(instance_id), str(rank), model, url], size)
        yield sizes
        if self.silent is not None:
            yield GaugeMetricFamily(
                "switchyard_router_kv_silent_workers",
                "instances routed to whose KV events never arrived",
                value=self.silent(),
            )
        if self.kv_workers is not None:
            yield from self._streams(known, self.kv_workers(), self.clock())
        if self.tracker is not None:
            yield from self._loads(known, self.tracker)
        if self.stats is not None:
            yield from self._plugins(self.stats)

    @staticmethod
    def _streams(
        known: Mapping[int, Instance],
        workers: list[tuple[WorkerKey, WorkerKvStats]],
        now: float,
    ) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Per worker: how fresh the index is (ZMQ-fed workers)."""
        labels = ["instance_id", "dp_rank", "model", "worker"]
        age = GaugeMetricFamily(
            "switchyard_router_kv_last_event_age_seconds",
            "seconds since the worker's last KV event (live or replayed); absent before one",
            labels=labels,
        )
        seq = GaugeMetricFamily(
            "switchyard_router_kv_last_seq", "sequence of the last KV batch applied", labels=labels
        )
        lag = GaugeMetricFamily(
            "switchyard_router_kv_index_lag_seconds",
            "the router's estimate of how far its index is behind the engine: how long a "
            "batch has waited for a replay, else the last batch's publish-to-apply delay",
            labels=labels,
        )
        connected = GaugeMetricFamily(
            "switchyard_router_kv_connected",
            "1 while the transport to the worker's publisher is connected",
            labels=labels,
        )
        stale = GaugeMetricFamily(
            "switchyard_router_kv_suspected_stale",
            "1 while the worker's KV events have stopped although requests run there",
            labels=labels,
        )
        counters = {
            name: CounterMetricFamily(f"switchyard_router_kv_worker_{name}", doc, labels=labels)
            for name, doc in (
                ("gaps", "sequence gaps on the worker's KV event stream"),
                ("replays", "replays asked of the worker's engine"),
                ("resets", "restarts of the worker's publisher (index rebuilt)"),
                ("reconnects", "(re)connections to the worker's publisher"),
            )
        }
        for (instance_id, rank), stats in workers:
            instance = known.get(instance_id)
            values = [
                str(instance_id),
                str(rank),
                instance.model if instance else "",
                instance.url if instance else "",
            ]
            event_age = stats.event_age(now)
            if event_age is not None:
                age.add_metric(values, event_age)
            if stats.last_seq is not None:
                seq.add_metric(values, stats.last_seq)
            lag.add_metric(values, stats.index_lag(now))
            connected.add_metric(values, 1.0 if stats.connected else 0.0)
            stale.add_metric(values, 1.0 if stats.suspected_stale else 0.0)
            for name, family in counters.items():
                family.add_metric(values, getattr(stats, name))
        yield from (age, seq, lag, connected, stale)
        yield from counters.values()

    @staticmethod
    def _loads(
        known: Mapping[int, Instance], tracker: InFlightTracker
    ) -> Iterator[GaugeMetricFamily]:
        in_flight = GaugeMetricFamily(
            "switchyard_router_worker_in_flight",
            "requests routed to each worker and not finished (the router's own bookkeeping)",
            labels=["model", "worker", "dp_rank"],
        )
        active = GaugeMetricFamily(
            "switchyard_router_worker_active_tokens",
            "prompt tokens of the requests running on each worker (the router's load estimate)",
            labels=["model", "worker", "dp_rank"],
        )
        for (instance_id, rank), load in tracker.loads():
            instance = known.get(instance_id)
            if instance is None:
                continue
            labels = [instance.model, instance.url, str(rank)]
            in_flight.add_metric(labels, load.in_flight)
            active.add_metric(labels, load.active_tokens)
        yield in_flight
        yield active

    @staticmethod
    def _plugins(stats: PluginStats) -> Iterator[CounterMetricFamily]:
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
        for name, stat in stats.by_plugin.items():
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
        instances: Callable[[], Mapping[int, Instance]] | None = None,
        tracker: InFlightTracker | None = None,
        *,
        kv_workers: KvWorkers | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = service_registry("router")
        self.decisions = LoopCounter(
            "switchyard_router_decisions", "routing decisions", self.registry, ["mode", "model"]
        )
        self.routed = LoopCounter(
            "switchyard_router_routed",
            "requests routed to each worker",
            self.registry,
            ["model", "worker"],
        )
        self.latency = LoopHistogram(
            "switchyard_router_decision_seconds",
            "time to take one routing decision",
            _LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.hit_ratio = LoopHistogram(
            "switchyard_router_predicted_hit_ratio",
            "overlap blocks / prompt blocks of the chosen worker",
            _RATIO_BUCKETS,
            registry=self.registry,
        )
        self.predicted_ttft = LoopHistogram(
            "switchyard_router_predicted_ttft_seconds",
            "the chosen worker's predicted time to first token",
            _TTFT_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(
            _Collector(index, stats, silent, instances or dict, tracker, kv_workers, clock)
        )
