"""The router's flow gate (`--flow-config`): the deployment's admission queue.

Every preprocessor asks the first router of its list that answers (the same one for all,
as `switchyard up` lists them) before it routes a request: FlowAdmit is answered by one
FlowDecision, at once or when the request leaves the queue; FlowRelease ends a ticket;
FlowSync lists what a preprocessor runs (repairing lost releases, and, after a router
restart, rebuilding what runs). The rules are switchyard.common.flow.gate's; this module
holds who asked (ZMQ identities), predicts a request's TTFT with the router's time model
when it has an objective, wakes the gate for its expiries, and keeps the metrics.

Why the router: every preprocessor already talks to it, it decides per request in its
event loop with no lock (the gate is as cheap), and it owns the time model the objectives
need; a store (SQLite, PostgreSQL) would add a round trip and a lock per request. When no
router answers, each preprocessor runs the same gate on its share of the limits.

Metric labels are the file's names (bounded: see switchyard.common.flow.config).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from switchyard.common.flow.bands import Ticket
from switchyard.common.flow.config import FlowConfig
from switchyard.common.flow.gate import REASONS, Decision, FlowGate
from switchyard.protos.messages import (
    FlowAdmit,
    FlowDecision,
    FlowRelease,
    FlowStatus,
    FlowStatusRequest,
    FlowSync,
)

log = logging.getLogger(__name__)

WAIT_BUCKETS = (0.0, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
NO_GATE = "no_gate"  # FlowDecision.reason of a router started without --flow-config


class FlowService:
    def __init__(
        self,
        config: FlowConfig,
        send: Callable[[bytes, list[FlowDecision]], None],
        predict: Callable[[FlowAdmit, float], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.gate = FlowGate(config)
        self._send = send
        self._predict = predict
        self._clock = clock
        self._asker: dict[str, bytes] = {}  # queued ticket -> the identity waiting on it
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._warned: set[str] = set()  # peers whose config digest differs
        self.wait = Histogram(
            "switchyard_router_flow_wait_seconds",
            "time admitted requests waited in the flow gate's queue (0: at once)",
            ["priority", "flow"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        if registry is not None:
            registry.register(_Collector(self.gate, clock))

    def handle(self, identity: bytes, message: object) -> None:
        """One flow message from a preprocessor (the service dispatches them here)."""
        now = self._clock()
        if isinstance(message, FlowAdmit):
            self._admit(identity, message, now)
        elif isinstance(message, FlowRelease):
            self._deliver(self.gate.release(message.ticket, now, message.tokens), now)
        elif isinstance(message, FlowSync):
            held = [Ticket(h.ticket, h.flow, h.priority, h.units, h.cost) for h in message.held]
            self._deliver(self.gate.sync(message.peer, held, now), now)
        self._arm(now)

    def status(self, request: FlowStatusRequest) -> FlowStatus:
        return FlowStatus(request_id=request.request_id, state=self.gate.snapshot(self._clock()))

    def _admit(self, identity: bytes, message: FlowAdmit, now: float) -> None:
        if message.ticket in self.gate.tickets:  # a resend: answered when it is decided
            return
        if message.config and message.config != self.config.digest:
            if message.peer not in self._warned:
                self._warned.add(message.peer)
                log.warning(
                    "preprocessor %s runs another flow config (digest %s, this router's %s): "
                    "give every router and preprocessor the same file",
                    message.peer,
                    message.config,
                    self.config.digest,
                )
        engine_ttft = 0.0
        if message.objective_ms > 0 and message.token_ids and self._predict is not None:
            engine_ttft = self._predict(message, now)
        ticket = Ticket(
            message.ticket,
            message.flow,
            message.priority,
            message.units,
            message.cost,
            peer=message.peer,
            objective_s=message.objective_ms / 1e3,
            engine_ttft_s=engine_ttft,
            max_wait_s=message.max_wait_s,
        )
        self._asker[ticket.id] = identity
        self._deliver(self.gate.offer(ticket, now), now)

    def _deliver(self, decisions: list[Decision], now: float) -> None:
        if not decisions:
            return
        peers = self.gate.peers(now)
        batches: dict[bytes, list[FlowDecision]] = {}
        for d in decisions:
            identity = self._asker.pop(d.ticket.id, None)
            if d.admitted:
                self.wait.labels(*self.gate.labels(d.ticket)).observe(d.wait_s)
            if identity is None:  # its asker is gone (a silent peer): nothing to tell
                continue
            batches.setdefault(identity, []).append(
                FlowDecision(
                    request_id=d.ticket.id,
                    admitted=d.admitted,
                    reason=d.reason,
                    message=d.message,
                    retry_after_s=d.retry_after_s,
                    wait_ms=d.wait_s * 1e3,
                    predicted_ttft_ms=d.predicted_s * 1e3,
                    peers=peers,
                )
            )
        for identity, batch in batches.items():
            self._send(identity, batch)

    def _arm(self, now: float) -> None:
        """Wake for the gate's next expiry (a queue timeout, a latest start), and every
        second while anything is held (silent peers, idle flows)."""
        due = self.gate.next_due()
        if self.gate.tickets or self.gate.bands:
            due = min(due, now + 1.0) if due is not None else now + 1.0
        if due is None:
            return
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = due
        self._timer = loop.call_later(max(0.0, due - now), self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = self._clock()
        self._deliver(self.gate.expire(now), now)
        self._arm(now)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def no_gate(request: FlowAdmit) -> FlowDecision:
    """What a router without --flow-config answers a FlowAdmit."""
    return FlowDecision(
        request_id=request.ticket,
        admitted=False,
        reason=NO_GATE,
        message="this router runs no flow gate (start it with --flow-config)",
    )


class _Collector(Collector):
    """The gate's state at scrape time: running and queued per (priority, flow) label, the
    admitted and shed counts, the preprocessors it hears from."""

    def __init__(self, gate: FlowGate, clock: Callable[[], float]) -> None:
        self.gate = gate
        self.clock = clock

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        gate = self.gate
        labels = ["priority", "flow"]
        running = GaugeMetricFamily(
            "switchyard_router_flow_running",
            "requests the flow gate admitted, running",
            labels=labels,
        )
        queued = GaugeMetricFamily(
            "switchyard_router_flow_queued", "requests waiting in the flow gate", labels=labels
        )
        for key, (r, q) in sorted(gate.counts().items()):
            running.add_metric(list(key), r)
            queued.add_metric(list(key), q)
        yield running
        yield queued
        admitted = CounterMetricFamily(
            "switchyard_router_flow_admitted", "requests the flow gate admitted", labels=labels
        )
        for key, n in sorted(list(gate.admitted.items())):
            admitted.add_metric(list(key), n)
        yield admitted
        shed = CounterMetricFamily(
            "switchyard_router_flow_shed",
            f"requests the flow gate refused, by reason ({', '.join(REASONS)})",
            labels=[*labels, "reason"],
        )
        for key3, n in sorted(list(gate.shed.items())):
            shed.add_metric(list(key3), n)
        yield shed
        yield GaugeMetricFamily(
            "switchyard_router_flow_running_units",
            "sequences running under the flow gate (max_running bounds them, burst aside)",
            value=gate.running_units,
        )
        yield GaugeMetricFamily(
            "switchyard_router_flow_peers",
            "preprocessors the flow gate heard from in the last 5 s",
            value=gate.peers(self.clock()),
        )
