"""The flow gate: which request runs next, and which is refused at once.

    offer(ticket)  -> admitted now | refused now | queued (decided by a later call)
    release(id)    -> the admissions the freed units allow
    expire(now)    -> the queued requests refused (queue timeout, objective out of reach)
    sync(peer, ..) -> a preprocessor's running requests, as it holds them (lost notices)

Admission, in order:

1. A request runs at once while the deployment runs fewer than `max_running` units and
   nothing as urgent waits before it (queue order below).
2. Beyond that, a request that outranks running ones runs at once up to `max_running +
   burst`, as if it had preempted them (nothing is preempted: requests of their rank are just
   not admitted again until the deployment is back under max_running). It outranks a
   running request of a less urgent band; and, when its own flow took at most its share of
   its band's recent tokens and has nothing queued, one of a flow that took more than its
   share (shares count from when the band's active flows last grew: bands.py). It runs
   only if the units it outranks cover the excess over max_running.
3. Otherwise it queues (`max_queued` at most; a full queue makes room by refusing the last
   request of the largest flow of the least urgent band, when that ranks below the
   newcomer) and runs when units free up: the most urgent band first; within a band, flows
   by start-time fair queuing in tokens (bands.py); within a flow, by deadline.

A request with a TTFT objective is refused at once when its predicted wait for a slot plus
its predicted TTFT on the best engine exceeds the objective, and a queued one as soon as its
deadline minus that engine TTFT passes: refused early rather than served late.

Pure and synchronous: every call takes `now` (seconds, monotonic); nothing here sleeps, sends
or reads a clock.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

from switchyard.common.flow.bands import GONE, QUEUED, RUNNING, Band, FlowState, Ticket
from switchyard.common.flow.config import FlowConfig

QUEUE_FULL = "queue_full"
QUEUE_TIMEOUT = "queue_timeout"
FLOW_LIMIT = "flow_limit"
TTFT_OBJECTIVE = "ttft_objective"
REASONS = (QUEUE_FULL, QUEUE_TIMEOUT, FLOW_LIMIT, TTFT_OBJECTIVE)
# A preprocessor's notices of requests that ended may be lost; its sync every SYNC_S lists
# what it still runs. A running ticket it no longer lists (and admitted more than
# SYNC_GRACE_S ago, so not one whose admission is still on its way) ended; a peer silent
# for PEER_TIMEOUT_S is gone with its tickets.
SYNC_S = 1.0
SYNC_GRACE_S = 2.0
PEER_TIMEOUT_S = 5.0
_EWMA = 0.1  # weight of the newest run time in the mean


@dataclass(frozen=True, slots=True)
class Limits:
    """The capacity a gate enforces: the file's, or a share of it (a preprocessor's own gate
    while no router answers)."""

    max_running: int
    burst: int
    max_queued: int
    queue_timeout_s: float

    @classmethod
    def of(cls, config: FlowConfig, share: int = 1) -> Limits:
        """The file's limits over `share` gates (at least one unit each)."""
        return cls(
            max(1, config.max_running // share),
            config.burst // share,
            max(1, config.max_queued // share) if config.max_queued else 0,
            config.queue_timeout_s,
        )


class Decision(NamedTuple):
    ticket: Ticket
    admitted: bool
    reason: str = ""  # one of REASONS when refused
    message: str = ""
    wait_s: float = 0.0  # how long it waited in the queue
    retry_after_s: float = 0.0  # refused: when a retry may succeed
    predicted_s: float = 0.0  # refused by objective: the TTFT it was predicted


class FlowGate:
    def __init__(self, config: FlowConfig, limits: Limits | None = None) -> None:
        self.config = config
        self.limits = limits or Limits.of(config)
        self.window = config.share_window_s
        self.running_units = 0
        self.running = 0  # tickets
        self.queued = 0
        self.tickets: dict[str, Ticket] = {}
        self.bands: dict[int, Band] = {}
        self._due: list[tuple[float, int, Ticket]] = []  # queued tickets by when they expire
        self._seq = 0
        self.mean_run_s: float | None = None  # admission to release, recent mean
        self._by_flow: Counter[str] = Counter()  # running + queued tickets per flow name
        self._peers: dict[str, float] = {}  # peer -> last heard from
        self._by_peer: dict[str, set[str]] = {}
        # By metric labels (bounded): (priority label, flow label[, reason]) -> count.
        self.admitted: Counter[tuple[str, str]] = Counter()
        self.shed: Counter[tuple[str, str, str]] = Counter()
        self._swept_at = 0.0
        self._pending: list[Decision] = []  # made by a call, returned with its others

    # ---- the calls -------------------------------------------------------------------

    def offer(self, ticket: Ticket, now: float) -> list[Decision]:
        """A new request: its decision if made now (none while it waits in the queue), and
        the decision of a queued request it displaced."""
        if ticket.id in self.tickets:  # a resend of one already here: decided when it is
            return []
        self._seq += 1
        ticket.seq = self._seq
        ticket.arrived = now
        if ticket.objective_s > 0:
            ticket.deadline = now + ticket.objective_s
        if ticket.peer:
            self._peers[ticket.peer] = now
        spec = self.config.spec(ticket.flow)
        if spec.max_requests and self._by_flow[ticket.flow] >= spec.max_requests:
            return self._refused(
                ticket,
                FLOW_LIMIT,
                f"Flow {ticket.flow!r} already has {spec.max_requests} requests running or "
                "waiting (its max_requests); retry later.",
                self._slot_s(1),
            )
        band = self.bands.get(ticket.priority)
        if band is None:
            band = self.bands[ticket.priority] = Band(ticket.priority)
        flow = band.flows.get(ticket.flow)
        if flow is None:
            flow = band.flows[ticket.flow] = FlowState(ticket.flow, spec.weight)
        if not flow.active:
            band.joined(flow, now)
        flow.last_active = now
        at_once = self._at_once(ticket, band, flow, now)
        wait = 0.0 if at_once else self._predicted_wait(ticket, band, flow)
        if ticket.objective_s > 0 and now + wait + ticket.engine_ttft_s > ticket.deadline:
            predicted = wait + ticket.engine_ttft_s
            return self._refused(
                ticket,
                TTFT_OBJECTIVE,
                f"The predicted time to first token, {predicted * 1e3:.0f} ms "
                f"({wait * 1e3:.0f} ms waiting for a slot, {ticket.engine_ttft_s * 1e3:.0f} ms "
                f"on the best engine), exceeds the {ticket.objective_s * 1e3:.0f} ms left of the "
                "request's TTFT objective; retry later or with a larger objective.",
                max(wait - (ticket.objective_s - ticket.engine_ttft_s), self._slot_s(1)),
                predicted,
            )
        self.tickets[ticket.id] = ticket
        self._by_flow[ticket.flow] += 1
        self._by_peer.setdefault(ticket.peer, set()).add(ticket.id)
        if at_once:
            start = max(band.vtime, flow.finish)
            self._run(ticket, band, flow, start, now)
            return [Decision(ticket, True)]
        if self.limits.max_queued <= self.queued and not self._make_room(ticket, band, flow):
            self._forget(ticket)
            return self._refused(
                ticket,
                QUEUE_FULL,
                f"The deployment is at capacity ({self.limits.max_running} running, "
                f"{self.limits.max_queued} waiting); retry later.",
                self._slot_s(self.queued + 1),
            )
        ticket.state = QUEUED
        band.enqueue(flow, ticket)
        self.queued += 1
        limit = self.limits.queue_timeout_s
        if ticket.max_wait_s > 0:
            limit = min(limit, ticket.max_wait_s)
        heapq.heappush(self._due, (min(now + limit, ticket.latest_start), ticket.seq, ticket))
        out, self._pending = self._pending, []
        return out

    def release(self, ticket_id: str, now: float, tokens: int = -1) -> list[Decision]:
        """The request ended (or gave up waiting): its units go to the queue. `tokens`: what
        it really used (prompt + generated), refunded against what it was charged."""
        ticket = self.tickets.get(ticket_id)
        if ticket is None:
            return []
        if ticket.state == QUEUED:
            band = self.bands[ticket.priority]
            band.unqueue(band.flows[ticket.flow], ticket)
            self.queued -= 1
            self._forget(ticket)
            return []
        run = now - ticket.admitted_at
        if run >= 0:
            mean = self.mean_run_s
            self.mean_run_s = run if mean is None else mean + _EWMA * (run - mean)
        owner = self.bands[ticket.priority].flows[ticket.flow]  # running: its flow is kept
        if 0 <= tokens < ticket.cost:
            owner.finish -= (ticket.cost - tokens) / owner.weight
        self._stop(ticket)
        return self._fill(now)

    def expire(self, now: float) -> list[Decision]:
        """Queued requests past their wait limit or their latest start, refused; silent
        peers' tickets dropped; idle flows forgotten."""
        out: list[Decision] = []
        due = self._due
        while due and due[0][0] <= now:
            _, _, ticket = heapq.heappop(due)
            if ticket.state != QUEUED:
                continue
            band = self.bands[ticket.priority]
            band.unqueue(band.flows[ticket.flow], ticket)
            self.queued -= 1
            self._forget(ticket)
            waited = now - ticket.arrived
            if ticket.objective_s > 0 and now >= ticket.latest_start:
                out.append(
                    self._refuse(
                        ticket,
                        TTFT_OBJECTIVE,
                        f"The request waited {waited * 1e3:.0f} ms for a slot and can no "
                        f"longer get its first token within the {ticket.objective_s * 1e3:.0f} "
                        "ms that were left of its TTFT objective; retry later.",
                        self._slot_s(self.queued + 1),
                        waited + ticket.engine_ttft_s,
                        waited,
                    )
                )
            else:
                out.append(
                    self._refuse(
                        ticket,
                        QUEUE_TIMEOUT,
                        f"The request waited {waited:.3g}s for one of the "
                        f"{self.limits.max_running} running slots; retry later.",
                        self._slot_s(self.queued + 1),
                        wait_s=waited,
                    )
                )
        if now - self._swept_at >= 1.0:
            self._swept_at = now
            for peer, seen in list(self._peers.items()):
                if now - seen > PEER_TIMEOUT_S:
                    self._drop_peer(peer)
            self._sweep_flows(now)
            out += self._fill(now)
        return out

    def next_due(self) -> float | None:
        """When `expire` has something to do next (None: nothing queued)."""
        due = self._due
        while due and due[0][2].state != QUEUED:
            heapq.heappop(due)
        return due[0][0] if due else None

    def sync(self, peer: str, held: list[Ticket], now: float) -> list[Decision]:
        """A preprocessor's running requests: tickets it no longer holds end, tickets this
        gate does not know (admitted by another gate: a router that went away, or its own
        while none answered) count from now on."""
        self._peers[peer] = now
        listed = {t.id for t in held}
        mine = self._by_peer.get(peer, set())
        for ticket_id in list(mine):
            ticket = self.tickets[ticket_id]
            if (
                ticket.state == RUNNING
                and ticket_id not in listed
                and now - ticket.admitted_at > SYNC_GRACE_S
            ):
                self._stop(ticket)
        for ticket in held:
            if ticket.id in self.tickets:
                continue
            ticket.peer = peer
            self._seq += 1
            ticket.seq = self._seq
            ticket.arrived = now
            band = self.bands.get(ticket.priority)
            if band is None:
                band = self.bands[ticket.priority] = Band(ticket.priority)
            flow = band.flows.get(ticket.flow)
            if flow is None:
                weight = self.config.spec(ticket.flow).weight
                flow = band.flows[ticket.flow] = FlowState(ticket.flow, weight)
            self.tickets[ticket.id] = ticket
            self._by_flow[ticket.flow] += 1
            self._by_peer.setdefault(peer, set()).add(ticket.id)
            if not flow.active:
                band.joined(flow, now)
            self._mark_running(ticket, band, flow, now)
        return self._fill(now)

    def labels(self, ticket: Ticket) -> tuple[str, str]:
        """The ticket's metric labels: (priority, flow)."""
        config = self.config
        return config.priority_label(ticket.priority), config.flow_label(ticket.flow)

    def counts(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(priority label, flow label) -> (running, queued) tickets."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for ticket in list(self.tickets.values()):
            key = self.labels(ticket)
            running, queued = out.get(key, (0, 0))
            if ticket.state == RUNNING:
                running += 1
            elif ticket.state == QUEUED:
                queued += 1
            out[key] = (running, queued)
        return out

    def peers(self, now: float) -> int:
        """Preprocessors heard from lately."""
        return sum(1 for seen in self._peers.values() if now - seen <= PEER_TIMEOUT_S)

    # ---- admission rules ---------------------------------------------------------------

    def _at_once(self, ticket: Ticket, band: Band, flow: FlowState, now: float) -> bool:
        n, units, limits = self.running_units, ticket.units, self.limits
        ahead = any(b.queued for p, b in self.bands.items() if p <= ticket.priority)
        if n + units <= limits.max_running and not ahead:
            return True
        if n == 0:  # larger than the whole deployment: alone
            return True
        return flow.queued == 0 and self._outranks(ticket, band, flow, now)

    def _outranks(self, ticket: Ticket, band: Band, flow: FlowState, now: float) -> bool:
        """Within the burst, the running units it outranks cover the excess over
        max_running (rule 2); nothing more urgent waits."""
        n, limits = self.running_units, self.limits
        excess = n + ticket.units - limits.max_running
        if excess > limits.burst:
            return False
        if any(b.queued for p, b in self.bands.items() if p < ticket.priority):
            return False
        outranked = sum(b.running_units for p, b in self.bands.items() if p > ticket.priority)
        if outranked < excess and band.under_share(flow, now, self.window):
            outranked += band.over_share_units(flow, now, self.window)
        return outranked >= excess

    def _predicted_wait(self, ticket: Ticket, band: Band, flow: FlowState) -> float:
        """Seconds until it would run: the units ahead of it (more urgent bands, and its share
        of its band's queue) freeing at the running requests' recent pace."""
        mean = self.mean_run_s
        if mean is None:
            return 0.0
        ahead = sum(b.queued_units for p, b in self.bands.items() if p < ticket.priority)
        own = flow.queued_ahead(ticket) + ticket.units
        weights = band.active_weight(flow)
        in_band = min(band.queued_units, own * weights / flow.weight - ticket.units)
        excess = max(0, self.running_units + ticket.units - self.limits.max_running)
        return (ahead + in_band + excess) * mean / max(self.running_units, 1)

    def _make_room(self, ticket: Ticket, band: Band, flow: FlowState) -> bool:
        """A full queue: refuse the last request of the largest flow of the least urgent
        band that ranks below `ticket`, if there is one."""
        for priority in sorted(self.bands, reverse=True):
            if priority < ticket.priority:
                return False
            other = self.bands[priority]
            if not other.queued:
                continue
            largest = max(
                (f for f in other.flows.values() if f.queued), key=lambda f: f.queued / f.weight
            )
            if priority == ticket.priority and (
                largest is flow
                or largest.queued / largest.weight <= (flow.queued + 1) / flow.weight
            ):
                return False
            victim = max((t for _, _, t in largest.queue if t.state == QUEUED), key=_last)
            other.unqueue(largest, victim)
            self.queued -= 1
            self._forget(victim)
            self._pending.append(
                self._refuse(
                    victim,
                    QUEUE_FULL,
                    "The queue is full and a request that ranks above this one took its "
                    "place; retry later.",
                    self._slot_s(self.queued + 1),
                )
            )
            return True
        return False

    # ---- transitions -------------------------------------------------------------------

    def _run(self, ticket: Ticket, band: Band, flow: FlowState, start: float, now: float) -> None:
        band.charge(flow, ticket.cost, start, now, self.window)
        self._mark_running(ticket, band, flow, now)
        self.admitted[self.labels(ticket)] += 1

    def _mark_running(self, ticket: Ticket, band: Band, flow: FlowState, now: float) -> None:
        ticket.state = RUNNING
        ticket.admitted_at = now
        flow.running += 1
        flow.running_units += ticket.units
        flow.running_cost += ticket.cost
        flow.last_active = now
        band.running_units += ticket.units
        self.running += 1
        self.running_units += ticket.units

    def _stop(self, ticket: Ticket) -> None:
        band = self.bands[ticket.priority]
        flow = band.flows[ticket.flow]
        flow.running -= 1
        flow.running_units -= ticket.units
        flow.running_cost -= ticket.cost
        band.running_units -= ticket.units
        self.running -= 1
        self.running_units -= ticket.units
        self._forget(ticket)

    def _forget(self, ticket: Ticket) -> None:
        if self.tickets.pop(ticket.id, None) is not None:
            left = self._by_flow[ticket.flow] - 1
            if left > 0:
                self._by_flow[ticket.flow] = left
            else:
                del self._by_flow[ticket.flow]
            mine = self._by_peer.get(ticket.peer)
            if mine is not None:
                mine.discard(ticket.id)
        ticket.state = GONE

    def _fill(self, now: float) -> list[Decision]:
        """Admit from the queue while units are free; then queued requests that outrank
        running ones, within the burst (rule 2: a flow under its share that had to queue
        need not wait for the deployment to get back under max_running)."""
        out, self._pending = self._pending, []
        while self.queued:
            priority = min(p for p, b in self.bands.items() if b.queued)
            band = self.bands[priority]
            found = band.next()
            if found is None:  # counts and heaps disagree: nothing left to admit here
                break
            flow, ticket = found
            if self.running_units and self.running_units + ticket.units > self.limits.max_running:
                break
            self._dequeue(band, flow, ticket, flow.start, now, out)
            band.served(flow, ticket.seq)
        if self.queued and self.limits.burst:
            for priority in sorted(p for p, b in self.bands.items() if b.queued):
                band = self.bands[priority]
                for flow in [f for f in band.flows.values() if f.queued]:
                    head = flow.head()
                    while head is not None and self._outranks(head, band, flow, now):
                        self._dequeue(band, flow, head, max(band.vtime, flow.finish), now, out)
                        band.served_out_of_turn(flow, head.seq)
                        head = flow.head()
                if band.queued:
                    break  # a less urgent band's requests do not outrank what waits here
        return out

    def _dequeue(
        self,
        band: Band,
        flow: FlowState,
        ticket: Ticket,
        start: float,
        now: float,
        out: list[Decision],
    ) -> None:
        heapq.heappop(flow.queue)
        band.unqueue(flow, ticket)
        self.queued -= 1
        self._run(ticket, band, flow, start, now)
        out.append(Decision(ticket, True, wait_s=now - ticket.arrived))

    def _refuse(
        self,
        ticket: Ticket,
        reason: str,
        message: str,
        retry_after_s: float,
        predicted_s: float = 0.0,
        wait_s: float = 0.0,
    ) -> Decision:
        self.shed[(*self.labels(ticket), reason)] += 1
        return Decision(ticket, False, reason, message, wait_s, retry_after_s, predicted_s)

    def _refused(self, ticket: Ticket, *args: Any) -> list[Decision]:
        out, self._pending = self._pending, []
        return [self._refuse(ticket, *args), *out]

    def _slot_s(self, ahead: int) -> float:
        """Seconds until `ahead` units are likely free: the recent mean run time spread
        over the running slots."""
        mean = self.mean_run_s if self.mean_run_s is not None else 1.0
        return mean * ahead / max(self.limits.max_running, 1)

    def _drop_peer(self, peer: str) -> None:
        del self._peers[peer]
        for ticket_id in list(self._by_peer.pop(peer, set())):
            ticket = self.tickets.get(ticket_id)
            if ticket is None:
                continue
            if ticket.state == QUEUED:
                band = self.bands[ticket.priority]
                band.unqueue(band.flows[ticket.flow], ticket)
                self.queued -= 1
                self._forget(ticket)
            else:
                self._stop(ticket)

    def _sweep_flows(self, now: float) -> None:
        """Forget flows idle for a share window (their recent tokens have decayed) and
        bands left empty."""
        for priority, band in list(self.bands.items()):
            for name, flow in list(band.flows.items()):
                if not flow.active and not flow.in_heap and now - flow.last_active > self.window:
                    del band.flows[name]
            if not band.flows:
                del self.bands[priority]

    # ---- what /debug/flow shows ----------------------------------------------------------

    def snapshot(self, now: float, limit: int = 50) -> dict[str, Any]:
        config, window = self.config, self.window
        bands = []
        for priority in sorted(self.bands):
            band = self.bands[priority]
            flows = []
            for flow in sorted(band.flows.values(), key=lambda f: -f.running_units - f.queued):
                flows.append(
                    {
                        "flow": flow.name,
                        "weight": flow.weight,
                        "running": flow.running,
                        "running_units": flow.running_units,
                        "queued": flow.queued,
                        "recent_tokens": round(flow.decayed(now, window), 1),
                        "under_share": band.under_share(flow, now, window),
                        "finish_tag": round(flow.finish, 3),
                    }
                )
            bands.append(
                {
                    "priority": priority,
                    "label": config.priority_label(priority),
                    "virtual_time": round(band.vtime, 3),
                    "running_units": band.running_units,
                    "queued": band.queued,
                    "flows": flows[:limit],
                }
            )
        waiting = sorted(
            (t for t in self.tickets.values() if t.state == QUEUED),
            key=lambda t: (t.priority, t.deadline, t.seq),
        )
        return {
            "limits": {
                "max_running": self.limits.max_running,
                "burst": self.limits.burst,
                "max_queued": self.limits.max_queued,
                "queue_timeout_s": self.limits.queue_timeout_s,
            },
            "running": self.running,
            "running_units": self.running_units,
            "queued": self.queued,
            "mean_run_s": self.mean_run_s,
            "peers": self.peers(now),
            "bands": bands,
            "waiting": [
                {
                    "ticket": t.id,
                    "flow": t.flow,
                    "priority": t.priority,
                    "units": t.units,
                    "waited_s": round(now - t.arrived, 3),
                    "deadline_in_s": None if t.deadline == math.inf else round(t.deadline - now, 3),
                }
                for t in waiting[:limit]
            ],
        }


def _last(ticket: Ticket) -> tuple[float, int]:
    return (ticket.deadline, ticket.seq)
