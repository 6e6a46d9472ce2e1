"""The dispatcher's Prometheus metrics (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class DispatcherMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.in_flight = Gauge(
            "switchyard_dispatcher_in_flight", "generations running", ["instance_id"], registry=r
        )
        self.errors = Counter(
            "switchyard_dispatcher_engine_errors",
            "failed generations by error kind",
            ["kind"],
            registry=r,
        )
        self.generations = Counter(
            "switchyard_dispatcher_generations", "generations started", registry=r
        )
        # replies / messages = how many replies one ZMQ message carries on average.
        self.replies = Counter(
            "switchyard_dispatcher_replies", "replies sent to preprocessors", registry=r
        )
        self.messages = Counter(
            "switchyard_dispatcher_reply_messages",
            "ZMQ messages carrying those replies (one per peer per loop iteration)",
            registry=r,
        )
