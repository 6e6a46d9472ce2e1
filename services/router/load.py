"""Load per worker: the router's own in-flight bookkeeping, and the engines' own reports.

InFlightTracker: a request is added when routed, its prefill is done at its first token,
it is freed at the end; a notice that never comes (a preprocessor died) expires after `ttl`
seconds. Per worker it sums requests in flight, requests not prefilled yet, their uncached
prompt tokens (the prefill queue the time model reads) and the prompt tokens of every request
in flight. At the first token it reports how long the prefill took, for the time model. A
request asked of its engine whole has no first token until its end: its prefill counts as
done at the time the router predicted for it (`prefilled_at`), and it times nothing.

EngineLoads: the latest report per worker (GetLoads polls, or the load records on a
SubscribeKvEvents stream), kept in the `EngineLoad` objects the workers point at. A report
older than `stale_after` seconds reads as none.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from switchyard.router.types import EngineLoad, RouterLoad, WorkerKey


@dataclass(slots=True)
class _Entry:
    key: WorkerKey
    load: RouterLoad
    deadline: float
    prefill_tokens: int
    tokens: int
    kv_tokens: int
    routed_at: float
    ahead_tokens: int  # prefill tokens queued on the worker when this one was routed
    learn: bool  # its first token times a prefill on this worker
    prefilling: bool = True


@dataclass(frozen=True, slots=True)
class FirstToken:
    """What a first token says about the worker's prefill speed."""

    key: WorkerKey
    tokens: int  # prefill tokens ahead of and in the request
    seconds: float


class InFlightTracker:
    def __init__(self, ttl: float = 600.0) -> None:
        if not ttl > 0:
            raise ValueError(f"--request-ttl must be > 0, got {ttl}")
        self.ttl = ttl
        self._requests: dict[str, _Entry] = {}
        self._loads: dict[WorkerKey, RouterLoad] = {}
        self._untimed: list[tuple[float, str]] = []  # (predicted end of prefill, request id)

    def load(self, key: WorkerKey) -> RouterLoad:
        """The worker's load object (created on first use, kept while the worker exists)."""
        load = self._loads.get(key)
        if load is None:
            load = self._loads[key] = RouterLoad()
        return load

    def __len__(self) -> int:
        return len(self._requests)

    def loads(self) -> list[tuple[WorkerKey, RouterLoad]]:
        """Every worker's load (for the metrics, read at scrape time)."""
        return list(self._loads.items())

    def add(
        self,
        request_id: str,
        key: WorkerKey,
        now: float,
        prefill_tokens: int = 0,
        tokens: int = 0,
        learn: bool = False,
        kv_tokens: int | None = None,
        prefilled_at: float | None = None,
    ) -> None:
        """`tokens`: its prompt; `kv_tokens`: those not cached there (default: all of them);
        `prefill_tokens`: those the worker will compute (none when a hop prefills them);
        `prefilled_at`: no first-token notice will come before the end, so its prefill counts
        as done then (see `prefilled`)."""
        self.finish(request_id)  # a re-route (migration) replaces the old placement
        load = self.load(key)
        kv = tokens if kv_tokens is None else kv_tokens
        self._requests[request_id] = _Entry(
            key, load, now + self.ttl, prefill_tokens, tokens, kv, now, load.prefill_tokens, learn
        )
        load.in_flight += 1
        load.in_prefill += 1
        load.prefill_tokens += prefill_tokens
        load.active_tokens += tokens
        load.kv_tokens += kv
        if prefilled_at is not None:
            heapq.heappush(self._untimed, (prefilled_at, request_id))

    def prefilled(self, now: float) -> None:
        """The untimed requests whose predicted prefill is over no longer queue prefill work
        (a cheap check per route: the earliest time first)."""
        untimed = self._untimed
        while untimed and untimed[0][0] <= now:
            self.first_token(heapq.heappop(untimed)[1])

    def first_token(self, request_id: str, now: float | None = None) -> FirstToken | None:
        entry = self._requests.get(request_id)
        if entry is None or not entry.prefilling:
            return None
        entry.prefilling = False
        load = entry.load
        load.in_prefill -= 1
        load.prefill_tokens -= entry.prefill_tokens
        if now is None or not entry.learn:
            return None
        return FirstToken(
            entry.key, entry.ahead_tokens + entry.prefill_tokens, now - entry.routed_at
        )

    def finish(self, request_id: str) -> None:
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        load = entry.load
        load.in_flight -= 1
        load.active_tokens -= entry.tokens
        load.kv_tokens -= entry.kv_tokens
        if entry.prefilling:
            load.in_prefill -= 1
            load.prefill_tokens -= entry.prefill_tokens

    def drop_instance(self, instance_id: int) -> None:
        for request_id in [r for r, e in self._requests.items() if e.key[0] == instance_id]:
            self.finish(request_id)
        for key in [k for k in self._loads if k[0] == instance_id]:
            del self._loads[key]

    def expire(self, now: float) -> int:
        stale = [r for r, e in self._requests.items() if e.deadline <= now]
        for request_id in stale:
            self.finish(request_id)
        return len(stale)


class EngineLoads:
    def __init__(self, stale_after: float = 10.0) -> None:
        self.stale_after = stale_after
        self._loads: dict[WorkerKey, EngineLoad] = {}
        self.reports = 0

    def load(self, key: WorkerKey) -> EngineLoad:
        load = self._loads.get(key)
        if load is None:
            load = self._loads[key] = EngineLoad()
        return load

    def update(self, key: WorkerKey, report: Any, now: float) -> None:
        """A common.proto EngineLoad record or a GetLoads SchedulerLoad (either family)."""
        load = self.load(key)
        if hasattr(report, "running_requests"):  # EngineLoad record
            load.running = int(report.running_requests)
            load.waiting = int(report.waiting_requests)
            load.waiting_uncached_tokens = (
                int(report.waiting_uncached_tokens)
                if report.HasField("waiting_uncached_tokens")
                else None
            )
            usage = report.active_token_usage if report.HasField("active_token_usage") else None
            load.kv_usage = float(usage if usage is not None else report.token_usage)
            load.max_running = int(report.max_running_requests)
        else:  # SchedulerLoad (SGLang's or vLLM's)
            load.running = max(0, int(report.num_running_reqs))
            load.waiting = max(0, int(report.num_waiting_reqs))
            fields = report.DESCRIPTOR.fields_by_name
            uncached = (
                int(report.num_waiting_uncached_tokens)
                if "num_waiting_uncached_tokens" in fields
                else 0
            )
            # 0 with a queue is "not reported" (vLLM leaves fields it cannot read at 0).
            load.waiting_uncached_tokens = uncached if uncached or not load.waiting else None
            load.kv_usage = float(report.token_usage)
            load.max_running = max(0, int(report.max_running_requests))
        load.at = now
        self.reports += 1

    def fresh(self, load: EngineLoad, now: float) -> bool:
        return load.at >= 0 and now - load.at <= self.stale_after

    def drop_instance(self, instance_id: int) -> None:
        for key in [k for k in self._loads if k[0] == instance_id]:
            del self._loads[key]
