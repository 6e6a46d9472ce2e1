"""The preprocessor's side of flow control: ask the deployment's gate, hold what it admitted.

The gate is the first router of the list that answers (RouterClient.flow_leader: the same
one for every preprocessor given the same list). `admit` sends FlowAdmit and waits for its
FlowDecision (queued there until it runs, or refused); `release` sends FlowRelease when the
request ends (or gives up waiting). Every SYNC_S, and before the first admit to a router
newly leading or reconnected (a restarted router forgot what runs), FlowSync lists every
request this process runs, whichever gate admitted it.

When no router answers (or the leading one runs no gate), this process runs the same gate
itself (`switchyard.common.flow.gate`) on its share of the limits: the file's, divided by
the preprocessors the router last said it hears from. Its TTFT objectives are then judged by
the queue alone (the time model is the router's). Requests admitted here are listed in the
next sync with a router, which counts them from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from switchyard.common.flow.bands import Ticket
from switchyard.common.flow.config import FlowConfig
from switchyard.common.flow.gate import SYNC_S, Decision, FlowGate, Limits
from switchyard.common.messaging import ConnectionLost
from switchyard.preprocessor.router_client import SUSPECT_S, RouterClient
from switchyard.protos.messages import FlowAdmit, FlowDecision, FlowHeld, FlowRelease, FlowSync

log = logging.getLogger(__name__)

NO_GATE = "no_gate"  # a router's answer when it runs no gate (router/flow.py)
LOCAL = "local"  # FlowClient.status()'s name for this process's own gate


@dataclass(slots=True)
class Held:
    held: FlowHeld
    router: object | None  # the router whose gate admitted it (None: this process's own)


class FlowClient:
    def __init__(
        self,
        config: FlowConfig,
        routers: RouterClient,
        instance: str = "",
        reply_margin: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.routers = routers
        self.peer = f"{instance or 'preprocessor'}#{os.getpid()}#{uuid.uuid4().hex[:6]}"
        self.reply_margin = reply_margin  # beyond the queue timeout, for the router's answer
        self._clock = clock
        self.peers = 1  # preprocessors the router last said it hears from
        self.gate = FlowGate(config, Limits.of(config))  # this process's own, when needed
        self.held: dict[str, Held] = {}
        self._waiters: dict[str, asyncio.Future[FlowDecision]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._synced: tuple[int, int] | None = None  # (id of the router, its drops)
        self._no_gate: set[str] = set()  # routers that said they run no gate
        self.local_admissions = 0
        self.leader = ""  # the endpoint of the gate used last ("local": this process's)

    # ---- admission ---------------------------------------------------------------------

    async def admit(self, message: FlowAdmit) -> FlowDecision:
        """The gate's decision for the request (admitted: hold it until `release`).
        Cancelled while waiting: the gate is told, the cancellation goes on."""
        for _ in range(len(self.routers.replicas.live)):
            router = self.routers.flow_leader()
            if router is None or router.endpoint in self._no_gate:
                break
            self._sync_if_new(router)
            timeout = self.config.queue_timeout_s + self.reply_margin
            try:
                decision: FlowDecision = await router.call(message.ticket, message, timeout)
            except ConnectionLost:
                continue  # the router died: its queue is gone, ask the next one
            except TimeoutError:
                router.suspect_until = time.monotonic() + SUSPECT_S
                log.warning("router %s did not answer a flow admission in %gs: skipped for "
                            "%gs", router.endpoint, timeout, SUSPECT_S)  # fmt: skip
                router.send_now(FlowRelease(message.ticket))
                return FlowDecision(
                    request_id=message.ticket,
                    admitted=False,
                    reason="queue_timeout",
                    message=f"The flow gate did not answer within {timeout:g}s; retry later.",
                    retry_after_s=1.0,
                )
            except asyncio.CancelledError:
                router.send_now(FlowRelease(message.ticket))  # it waits there no more
                raise
            if decision.reason == NO_GATE:
                self._no_gate.add(router.endpoint)
                log.error(
                    "router %s runs no flow gate (start it with --flow-config): this "
                    "preprocessor admits on its own share of the limits",
                    router.endpoint,
                )
                break
            self.leader = router.endpoint
            if decision.peers:
                self.peers = decision.peers
            if decision.admitted:
                self._hold(message, router)
            return decision
        return await self._admit_here(message)

    def release(self, ticket: str, tokens: int = -1) -> None:
        """The request ended (or gave up waiting): its gate frees its units (this process's
        own too, which counts a router's tickets once it took over from it)."""
        held = self.held.pop(ticket, None)
        if held is None:
            return
        self._deliver(self.gate.release(ticket, self._clock(), tokens))
        router = held.router
        if router is not None and getattr(router, "connected", False):
            router.send_now(FlowRelease(ticket, tokens))  # type: ignore[attr-defined]

    def _hold(self, message: FlowAdmit, router: object | None) -> None:
        held = FlowHeld(message.ticket, message.flow, message.priority, message.units, message.cost)
        self.held[message.ticket] = Held(held, router)

    # ---- this process's own gate ---------------------------------------------------------

    async def _admit_here(self, message: FlowAdmit) -> FlowDecision:
        self.leader = LOCAL
        limits = Limits.of(self.config, max(1, self.peers))
        if limits != self.gate.limits:
            self.gate.limits = limits
        ticket = Ticket(
            message.ticket,
            message.flow,
            message.priority,
            message.units,
            message.cost,
            peer=self.peer,
            objective_s=message.objective_ms / 1e3,
            max_wait_s=message.max_wait_s,
        )
        now = self._clock()
        # What runs here counts, whichever gate admitted it (a router that just died).
        held = [Ticket(h.ticket, h.flow, h.priority, h.units, h.cost) for h in self._listed()]
        self._deliver(self.gate.sync(self.peer, held, now))
        future: asyncio.Future[FlowDecision] = asyncio.get_running_loop().create_future()
        self._waiters[ticket.id] = future
        self._deliver(self.gate.offer(ticket, now))
        self._arm(now)
        try:
            decision = await future
        except asyncio.CancelledError:
            self._waiters.pop(ticket.id, None)
            self._deliver(self.gate.release(ticket.id, self._clock()))
            raise
        if decision.admitted:
            self.local_admissions += 1
            self._hold(message, None)
        return decision

    def _deliver(self, decisions: list[Decision]) -> None:
        for d in decisions:
            future = self._waiters.pop(d.ticket.id, None)
            if future is None or future.done():
                if d.admitted:  # nobody waits for it any more
                    self.gate.release(d.ticket.id, self._clock())
                continue
            future.set_result(
                FlowDecision(
                    request_id=d.ticket.id,
                    admitted=d.admitted,
                    reason=d.reason,
                    message=d.message,
                    retry_after_s=d.retry_after_s,
                    wait_ms=d.wait_s * 1e3,
                    predicted_ttft_ms=d.predicted_s * 1e3,
                )
            )

    def _arm(self, now: float) -> None:
        due = self.gate.next_due()
        if due is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(max(0.0, due - now), self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = self._clock()
        self._deliver(self.gate.expire(now))
        self._arm(now)

    # ---- sync ------------------------------------------------------------------------

    def _sync_if_new(self, router: object) -> None:
        """A router leading for the first time (or again, after a restart) learns what this
        process runs before its first admit (sent first, in order)."""
        key = (id(router), getattr(router, "drops", 0))
        if key != self._synced:
            self._synced = key
            router.send_now(self._sync_message())  # type: ignore[attr-defined]

    def _listed(self) -> list[FlowHeld]:
        return [h.held for h in self.held.values()]

    def _sync_message(self) -> FlowSync:
        return FlowSync(peer=self.peer, held=self._listed())

    async def run_sync(self) -> None:
        """Every SYNC_S: the leading router learns what this process runs."""
        while True:
            await asyncio.sleep(SYNC_S)
            router = self.routers.flow_leader()
            if router is not None and router.endpoint not in self._no_gate:
                self._synced = (id(router), router.drops)
                router.send_now(self._sync_message())

    def status(self) -> dict[str, object]:
        return {
            "peer": self.peer,
            "gate": self.leader or None,
            "held": len(self.held),
            "peers": self.peers,
            "local_admissions": self.local_admissions,
            "local_gate": self.gate.snapshot(self._clock()) if self.leader == LOCAL else None,
        }

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for future in self._waiters.values():
            with contextlib.suppress(asyncio.InvalidStateError):
                future.cancel()


class FlowClientCollector(Collector):
    """What this process holds under flow control, read at scrape time."""

    def __init__(self, client: FlowClient) -> None:
        self.client = client

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        client = self.client
        yield GaugeMetricFamily(
            "switchyard_preprocessor_flow_held",
            "requests this process runs that a flow gate admitted",
            value=len(client.held),
        )
        yield CounterMetricFamily(
            "switchyard_preprocessor_flow_local_admissions",
            "requests this process's own flow gate admitted (no router's gate answered)",
            value=client.local_admissions,
        )
