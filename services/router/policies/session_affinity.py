"""Scorer: a session sticks to the worker it was last routed to (score 1 there, 0 elsewhere)
for `ttl_s` after its last request, unless that worker is overloaded: at capacity, or with at
least `min_in_flight` requests in flight and more than `overload_factor` x the least loaded
other candidate. The session key is the `x-session-id` header, else the OpenAI `user` field.

The comparison is with the least loaded other candidate, not with the candidates' average
(which counts the sticky worker itself): with two workers, "more than twice the average" is
more than both together, so the sticky worker never yielded, and an engine that restarted
(or joined) stayed idle while every session stayed where it had moved; with three, two
workers holding every session still never yielded to the idle third.

Give it a weight above the other scorers' sum to make stickiness win outright; a smaller
weight makes it a tie-breaker."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.router.types import Needs, PluginDeps, RouteContext, Worker, WorkerKey


@dataclass(frozen=True, slots=True)
class SessionAffinityParams:
    ttl_s: float = 600.0
    min_in_flight: int = 4
    overload_factor: float = 2.0
    max_sessions: int = 100_000

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {self.ttl_s}")
        if self.min_in_flight < 1:
            raise ValueError(f"min_in_flight must be >= 1, got {self.min_in_flight}")
        if not self.overload_factor >= 1:
            raise ValueError(f"overload_factor must be >= 1, got {self.overload_factor}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")


class SessionAffinity:
    name = "session_affinity"
    needs = Needs.SESSION
    Params = SessionAffinityParams

    def __init__(self, params: SessionAffinityParams, deps: PluginDeps) -> None:
        self.params = params
        # session -> (worker, expiry), least recently routed first
        self._table: collections.OrderedDict[str, tuple[WorkerKey, float]] = (
            collections.OrderedDict()
        )

    def sticky(self, session: str | None, now: float) -> WorkerKey | None:
        if session is None:
            return None
        entry = self._table.get(session)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._table[session]
            return None
        return entry[0]

    def overloaded(self, ctx: RouteContext, w: Worker, workers: Sequence[Worker]) -> bool:
        p = self.params
        window = w.max_running()
        report = ctx.engine_report(w)
        running = max(w.load.in_flight, report.running + report.waiting if report else 0)
        if window and running >= window and (report is None or report.waiting > 0):
            return True
        mine = w.load.in_flight
        if mine < p.min_in_flight:
            return False
        idlest = min((x.load.in_flight for x in workers if x is not w), default=mine)
        return mine > p.overload_factor * idlest

    def score(self, ctx: RouteContext, workers: Sequence[Worker]) -> list[float]:
        sticky = self.sticky(ctx.session, ctx.now)
        scores = [0.0] * len(workers)
        if sticky is None:
            return scores
        for i, w in enumerate(workers):
            if w.key == sticky:
                if not self.overloaded(ctx, w, workers):
                    scores[i] = 1.0
                break
        return scores

    def observe(self, ctx: RouteContext, chosen: Worker) -> None:
        session = ctx.session
        if session is None:
            return
        table = self._table
        table.pop(session, None)
        table[session] = (chosen.key, ctx.now + self.params.ttl_s)
        while len(table) > self.params.max_sessions:
            table.popitem(last=False)
        # Expired sessions at the front go as they come due.
        while table:
            oldest = next(iter(table.values()))
            if oldest[1] > ctx.now:
                break
            table.popitem(last=False)
