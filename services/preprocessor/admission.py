"""Admission control: at most `max_concurrent` requests run at once in this preprocessor,
at most `max_queued` wait for a slot, each at most `queue_timeout`; beyond that, 429 with a
Retry-After. Optionally, each client key holds at most `per_key` running + waiting requests.

A request takes its place before its body is read (`enter`), so a rejected one costs nothing
but its headers, and memory stays bounded whatever the offered load: running and queued
requests are capped, rejected ones are answered at once. Slots go to waiters in arrival
order. Retry-After is the expected wait for a slot: the recent mean request duration times
the queue ahead, over the slots.

Pure bookkeeping on the event loop, no lock: `enter` and `release` are synchronous.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

from switchyard.preprocessor.errors import RateLimitError, ShuttingDownError

DEFAULT_MAX_CONCURRENT = 512
DEFAULT_MAX_QUEUED = 1024
DEFAULT_QUEUE_TIMEOUT = 30.0
RETRY_AFTER_MAX_S = 60
_EWMA = 0.1  # weight of the newest duration in the mean


@dataclass(frozen=True)
class Limits:
    max_concurrent: int = DEFAULT_MAX_CONCURRENT  # 0: no limit
    max_queued: int = DEFAULT_MAX_QUEUED
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT
    per_key: int = 0  # 0: no per-key limit

    def __post_init__(self) -> None:
        if self.max_concurrent < 0:
            raise ValueError(f"--max-concurrent-requests must be >= 0, got {self.max_concurrent}")
        if self.max_queued < 0:
            raise ValueError(f"--max-queued-requests must be >= 0, got {self.max_queued}")
        if not self.queue_timeout > 0 or math.isinf(self.queue_timeout):
            raise ValueError(f"--queue-timeout must be > 0, got {self.queue_timeout}")
        if self.per_key < 0:
            raise ValueError(f"--max-requests-per-key must be >= 0, got {self.per_key}")


class Ticket:
    """One request's place: running (`admitted`) or waiting for a slot."""

    __slots__ = ("_admission", "key", "admitted", "_waiter", "_done", "started")

    def __init__(self, admission: Admission, key: bytes | None) -> None:
        self._admission = admission
        self.key = key
        self.admitted = False
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self.started = 0.0

    async def wait(self) -> None:
        """Until admitted; RateLimitError after the queue timeout, ShuttingDownError when the
        server starts shutting down meanwhile."""
        if self.admitted:
            return
        waiter = self._waiter
        assert waiter is not None
        admission = self._admission
        try:
            async with asyncio.timeout(admission.limits.queue_timeout):
                await waiter
        except TimeoutError:
            if self.admitted:  # a slot came in the same loop iteration
                return
            admission._rejected("queue_timeout")
            raise admission._limited(
                f"The request waited {admission.limits.queue_timeout:g}s for one of the "
                f"{admission.limits.max_concurrent} request slots; retry later."
            ) from None

    def release(self) -> None:
        """The request is over (or gave up): its slot or queue place is freed. Idempotent."""
        if self._done:
            return
        self._done = True
        self._admission._release(self)


class Admission:
    def __init__(self, limits: Limits = Limits(), clock: Callable[[], float] | None = None) -> None:
        self.limits = limits
        self.running = 0
        self._queue: collections.deque[Ticket] = collections.deque()
        self._per_key: collections.Counter[bytes] = collections.Counter()
        self._mean_s = 1.0  # recent mean request duration (seconds)
        self._clock = clock
        self.closed = False
        self.rejections: collections.Counter[str] = collections.Counter()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def enter(self, key: bytes | None = None) -> Ticket:
        """A place for a new request: admitted now, or queued (then `await ticket.wait()`).
        Raises RateLimitError (queue full, per-key limit) or ShuttingDownError."""
        if self.closed:
            raise ShuttingDownError()
        limits = self.limits
        if key is not None and limits.per_key and self._per_key[key] >= limits.per_key:
            self._rejected("per_key")
            raise self._limited(
                f"This API key already has {limits.per_key} requests running or waiting "
                "(--max-requests-per-key); retry later."
            )
        ticket = Ticket(self, key)
        if key is not None and limits.per_key:
            self._per_key[key] += 1
        if not limits.max_concurrent or (self.running < limits.max_concurrent and not self._queue):
            self._admit(ticket)
            return ticket
        if len(self._queue) >= limits.max_queued:
            if key is not None and limits.per_key:
                self._per_key[key] -= 1
            self._rejected("queue_full")
            raise self._limited(
                f"The server is at capacity ({limits.max_concurrent} requests running, "
                f"{limits.max_queued} waiting); retry later."
            )
        ticket._waiter = asyncio.get_running_loop().create_future()
        self._queue.append(ticket)
        return ticket

    def close(self) -> None:
        """Shutting down: waiters and newcomers get 503 (retry elsewhere)."""
        self.closed = True
        while self._queue:
            ticket = self._queue.popleft()
            if ticket._waiter is not None and not ticket._waiter.done():
                ticket._waiter.set_exception(ShuttingDownError())

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: mean duration x (queue ahead + 1) / slots."""
        slots = self.limits.max_concurrent or 1
        wait = self._mean_s * (len(self._queue) + 1) / slots
        return max(1, min(RETRY_AFTER_MAX_S, math.ceil(wait)))

    # ---- internals ----------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _admit(self, ticket: Ticket) -> None:
        ticket.admitted = True
        ticket.started = self._now()
        self.running += 1

    def _limited(self, message: str) -> RateLimitError:
        return RateLimitError(message, self.retry_after())

    def _rejected(self, reason: str) -> None:
        self.rejections[reason] += 1

    def _release(self, ticket: Ticket) -> None:
        if ticket.key is not None and self.limits.per_key:
            self._per_key[ticket.key] -= 1
            if self._per_key[ticket.key] <= 0:
                del self._per_key[ticket.key]
        if not ticket.admitted:  # gave up waiting (timeout, client gone)
            with contextlib.suppress(ValueError):  # already handed a slot, or shut out
                self._queue.remove(ticket)
            return
        self.running -= 1
        self._mean_s += _EWMA * (self._now() - ticket.started - self._mean_s)
        while self._queue and (
            not self.limits.max_concurrent or self.running < self.limits.max_concurrent
        ):
            waiter = self._queue.popleft()
            self._admit(waiter)
            assert waiter._waiter is not None
            if not waiter._waiter.done():
                waiter._waiter.set_result(None)


class AdmissionCollector:
    """Prometheus view of an Admission, read at scrape time (nothing counted per request):
    running and queued requests, and rejections by reason."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission

    def collect(self):  # type: ignore[no-untyped-def]
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        a = self._admission
        prefix = "switchyard_preprocessor_admission"
        yield GaugeMetricFamily(f"{prefix}_running", "requests holding a slot", value=a.running)
        yield GaugeMetricFamily(f"{prefix}_queued", "requests waiting for a slot", value=a.queued)
        rejected = CounterMetricFamily(
            f"{prefix}_rejected",
            "requests answered 429 (queue_full, queue_timeout, per_key)",
            labels=["reason"],
        )
        for reason in ("queue_full", "queue_timeout", "per_key"):
            rejected.add_metric([reason], a.rejections[reason])
        yield rejected
