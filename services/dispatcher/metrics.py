"""The dispatcher's Prometheus metrics (served on --metrics-port, default 7390).

Per-worker series carry the engine's `worker` URL and its `model` (both from fleet's instance
set, so bounded by the configured engines); `kind` is one of the engine fault kinds.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from switchyard.common.loop_counter import LoopCounter
from switchyard.common.loop_histogram import LoopHistogram
from switchyard.common.metrics import service_registry

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
WORKER = ["model", "worker"]


class DispatcherMetrics:
    def __init__(self) -> None:
        r = self.registry = service_registry("dispatcher")
        self.in_flight = Gauge(
            "switchyard_dispatcher_in_flight",
            "generations running on each engine",
            WORKER,
            registry=r,
        )
        self.errors = Counter(
            "switchyard_dispatcher_engine_errors",
            "failed generations by error kind and engine",
            ["kind", *WORKER],
            registry=r,
        )
        self.generations = Counter(
            "switchyard_dispatcher_generations",
            "generations (and embed calls) started on each engine",
            WORKER,
            registry=r,
        )
        self.engine_ttft = LoopHistogram(
            "switchyard_dispatcher_engine_time_to_first_token_seconds",
            "time from sending Generate to the engine's first token, per engine",
            _TTFT_BUCKETS,
            WORKER,
            registry=r,
        )
        # replies / messages = how many replies one ZMQ message carries on average.
        # Counted per flush, which at concurrency 1 is per token: no lock (LoopCounter).
        self.replies = LoopCounter(
            "switchyard_dispatcher_replies", "replies sent to preprocessors", registry=r
        )
        self.messages = LoopCounter(
            "switchyard_dispatcher_reply_messages",
            "ZMQ messages carrying those replies (one per peer per loop iteration)",
            registry=r,
        )
