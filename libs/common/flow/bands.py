"""The gate's bookkeeping: tickets, and per priority band the flows with their queues.

A `Band` holds one priority's flows and serves them by start-time fair queuing in tokens:
a flow that becomes backlogged starts at max(the band's virtual time, its last finish tag);
the backlogged flow with the smallest start goes next; serving a request of cost c moves the
flow's finish tag to start + c / weight and the band's virtual time to that start. So over a
busy period each flow gets tokens in proportion to its weight, whatever its requests' sizes.
Within a flow, requests go by deadline (their TTFT objective), then in arrival order.

Each flow also keeps a decayed sum of the tokens admitted for it (`recent`, time constant
`share_window_s`), which says whether it is under its share of the band: its part of the
band's recent tokens at most its weight's part of the active flows' weights. Shares are
measured among the flows that contend: when a flow becomes active beside others, every
flow's sum restarts from the tokens it runs now (as deficit round robin resets a flow's
deficit when it becomes backlogged), so what a flow took while it ran alone is not held
against it, while what each holds at that moment still counts.

Pure data and arithmetic; removals from the heaps are lazy (a ticket that left is marked
GONE and skipped when it reaches the top).
"""

from __future__ import annotations

import heapq
import math

QUEUED, RUNNING, GONE = "queued", "running", "gone"


class Ticket:
    """One request's place in the gate: what the preprocessor said, and the gate's state."""

    __slots__ = (
        "id",
        "peer",
        "flow",
        "priority",
        "units",
        "cost",
        "objective_s",
        "engine_ttft_s",
        "max_wait_s",
        "arrived",
        "deadline",
        "admitted_at",
        "seq",
        "state",
    )

    def __init__(
        self,
        id: str,
        flow: str,
        priority: int = 0,
        units: int = 1,
        cost: int = 1,
        *,
        peer: str = "",
        objective_s: float = 0.0,
        engine_ttft_s: float = 0.0,
        max_wait_s: float = 0.0,
    ) -> None:
        self.id = id
        self.peer = peer
        self.flow = flow
        self.priority = priority
        self.units = max(1, units)
        self.cost = max(1, cost)  # tokens: the prompt and the most it may generate
        self.objective_s = objective_s  # its TTFT objective from arrival (0: none)
        self.engine_ttft_s = engine_ttft_s  # predicted TTFT on the best engine (0: unknown)
        self.max_wait_s = max_wait_s  # its own deadline bounds its wait (0: none)
        self.arrived = 0.0
        self.deadline = math.inf  # arrival + objective
        self.admitted_at = 0.0
        self.seq = 0
        self.state = ""

    @property
    def latest_start(self) -> float:
        """Past this, even an at-once start would miss the objective."""
        return self.deadline - self.engine_ttft_s

    def __repr__(self) -> str:
        return f"Ticket({self.id!r}, {self.flow!r}, p={self.priority}, {self.state})"


class FlowState:
    """One flow within one band."""

    __slots__ = (
        "name",
        "weight",
        "queue",
        "queued",
        "queued_units",
        "running",
        "running_units",
        "running_cost",
        "start",
        "finish",
        "in_heap",
        "version",
        "recent",
        "recent_at",
        "last_active",
    )

    def __init__(self, name: str, weight: float) -> None:
        self.name = name
        self.weight = weight
        self.queue: list[tuple[float, int, Ticket]] = []  # (deadline, seq, ticket)
        self.queued = 0
        self.queued_units = 0
        self.running = 0
        self.running_units = 0
        self.running_cost = 0  # tokens of its running requests
        self.start = 0.0  # its head's start tag, while backlogged
        self.finish = 0.0  # the finish tag of its last request served
        self.in_heap = False
        self.version = 0  # its entry in the band's heap is current only with this version
        self.recent = 0.0  # tokens admitted, decayed
        self.recent_at = 0.0
        self.last_active = 0.0

    @property
    def active(self) -> bool:
        return bool(self.running or self.queued)

    def head(self) -> Ticket | None:
        queue = self.queue
        while queue and queue[0][2].state != QUEUED:
            heapq.heappop(queue)
        return queue[0][2] if queue else None

    def decayed(self, now: float, window: float) -> float:
        if now > self.recent_at:
            self.recent *= math.exp((self.recent_at - now) / window)
            self.recent_at = now
        return self.recent

    def queued_ahead(self, ticket: Ticket) -> int:
        """Units of this flow's queue that go before `ticket` (by deadline, then arrival)."""
        key = (ticket.deadline, ticket.seq)
        return sum(t.units for d, s, t in self.queue if t.state == QUEUED and (d, s) < key)


class Band:
    """The flows of one priority."""

    __slots__ = (
        "priority",
        "flows",
        "heap",
        "vtime",
        "queued",
        "queued_units",
        "running_units",
        "recent",
        "recent_at",
    )

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.flows: dict[str, FlowState] = {}
        # Backlogged flows by start tag: (start, seq, version, flow); an entry whose version is
        # not the flow's is stale (the flow was served out of turn) and skipped.
        self.heap: list[tuple[float, int, int, FlowState]] = []
        self.vtime = 0.0
        self.queued = 0
        self.queued_units = 0
        self.running_units = 0
        self.recent = 0.0
        self.recent_at = 0.0

    def decayed(self, now: float, window: float) -> float:
        if now > self.recent_at:
            self.recent *= math.exp((self.recent_at - now) / window)
            self.recent_at = now
        return self.recent

    def active_weight(self, extra: FlowState | None = None) -> float:
        total = sum(f.weight for f in self.flows.values() if f.active)
        if extra is not None and not extra.active:
            total += extra.weight
        return total

    def under_share(self, flow: FlowState, now: float, window: float) -> bool:
        """The flow took at most its weight's part of the band's recent tokens."""
        band = self.decayed(now, window)
        if band <= 0.0:
            return True
        weights = self.active_weight(flow)
        return flow.decayed(now, window) * weights <= flow.weight * band

    def over_share_units(self, but: FlowState, now: float, window: float) -> int:
        """Running units of the flows that took more than their part of the recent tokens
        (what a flow under its share may displace)."""
        band = self.decayed(now, window)
        if band <= 0.0:
            return 0
        weights = self.active_weight(but)
        return sum(
            f.running_units
            for f in self.flows.values()
            if f is not but
            and f.running_units
            and f.decayed(now, window) * weights > f.weight * band
        )

    def joined(self, flow: FlowState, now: float) -> None:
        """`flow` (nothing running or queued) has a request: if other flows are active, the
        shares restart among them from the tokens each runs now. Without this, a flow that
        ran alone before another arrived would count as over its share for a window and
        queue behind the newcomer's backlog instead of displacing it."""
        if not any(f.active for f in self.flows.values() if f is not flow):
            return
        total = 0.0
        for f in self.flows.values():
            f.recent = float(f.running_cost)
            f.recent_at = now
            total += f.recent
        self.recent = total
        self.recent_at = now

    def charge(self, flow: FlowState, cost: int, start: float, now: float, window: float) -> None:
        """A request of `flow` starts running: its finish tag, the virtual time, the shares."""
        flow.finish = start + cost / flow.weight
        if start > self.vtime:
            self.vtime = start
        self.decayed(now, window)
        flow.decayed(now, window)
        self.recent += cost
        flow.recent += cost

    def enqueue(self, flow: FlowState, ticket: Ticket) -> None:
        heapq.heappush(flow.queue, (ticket.deadline, ticket.seq, ticket))
        flow.queued += 1
        flow.queued_units += ticket.units
        self.queued += 1
        self.queued_units += ticket.units
        if not flow.in_heap:
            flow.start = max(self.vtime, flow.finish)
            flow.in_heap = True
            heapq.heappush(self.heap, (flow.start, ticket.seq, flow.version, flow))

    def unqueue(self, flow: FlowState, ticket: Ticket) -> None:
        """A queued ticket leaves (admitted, refused or cancelled); the heaps drop it later."""
        flow.queued -= 1
        flow.queued_units -= ticket.units
        self.queued -= 1
        self.queued_units -= ticket.units

    def next(self) -> tuple[FlowState, Ticket] | None:
        """The backlogged flow with the smallest start tag, and its head ticket."""
        heap = self.heap
        while heap:
            _, _, version, flow = heap[0]
            if version == flow.version:
                ticket = flow.head()
                if ticket is not None:
                    return flow, ticket
                flow.in_heap = False
            heapq.heappop(heap)
        return None

    def served(self, flow: FlowState, seq: int) -> None:
        """`flow`'s head was just admitted in turn (and charged): its next start tag."""
        heapq.heappop(self.heap)
        self._requeue(flow, seq, flow.finish)

    def served_out_of_turn(self, flow: FlowState, seq: int) -> None:
        """`flow`'s head was admitted ahead of the band's order (it outranked running
        requests): its entry moves to its new start tag."""
        flow.version += 1
        self._requeue(flow, seq, max(flow.start, flow.finish))

    def _requeue(self, flow: FlowState, seq: int, start: float) -> None:
        if flow.head() is not None:
            flow.start = start
            flow.in_heap = True
            heapq.heappush(self.heap, (start, seq, flow.version, flow))
        else:
            flow.in_heap = False
