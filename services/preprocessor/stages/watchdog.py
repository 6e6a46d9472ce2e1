"""Notices attempts that went silent, and the request's own end, without a timer per token.

An attempt may wait `first_token_timeout` for its first reply (a long prefill is legitimate)
and `gap_timeout` between replies after that (a frozen engine is not). An attempt asked of the
engine whole is silent until it ends: it may take what a streamed one could at the longest,
`first_token_timeout` + max_tokens x `gap_timeout`, and no more (an engine that stalls one
request while serving the rest would otherwise hold it forever). The request itself may
have a deadline (`end_at`: --request-timeout, or the client's request-timeout-ms), and may be
ended early by a shutdown past its grace (`end_now`). The token loop stamps each attempt's
`last` reply time; the watchdog keeps one timer per request, set for the earliest of these
times and re-armed when it finds the time moved, and wakes the token loop when something is
due: an overdue attempt fails (and migrates), a request past its end raises `end_error()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

from switchyard.preprocessor.errors import (
    DeadlineExceededError,
    RequestError,
    ShuttingDownError,
)
from switchyard.preprocessor.reply_queue import ReplyQueue

if TYPE_CHECKING:
    from switchyard.preprocessor.stages.generation import Attempt, Generation


class Shutdown:
    """Every running request's watchdog, so that a shutdown past its grace can end them all
    cleanly (an error event, not a cut stream). Shared by the requests of one process."""

    __slots__ = ("watchdogs", "ended")

    def __init__(self) -> None:
        self.watchdogs: set[Watchdog] = set()
        self.ended = False

    def end_all(self) -> int:
        self.ended = True
        watchdogs = list(self.watchdogs)
        for watchdog in watchdogs:
            watchdog.end_now(ShuttingDownError("The server shut down before the request ended."))
        return len(watchdogs)


class Watchdog:
    __slots__ = (
        "_loop",
        "_queue",
        "_gens",
        "_first",
        "_gap",
        "_handle",
        "_end_at",
        "_timeout",
        "_ended",
        "_shutdown",
        "expired",
    )

    def __init__(
        self,
        queue: ReplyQueue,
        generations: Iterable[Generation],
        first_token_timeout: float,
        gap_timeout: float,
        end_at: float | None = None,
        timeout: float = 0.0,
        shutdown: Shutdown | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue = queue
        self._gens = generations
        self._first = first_token_timeout
        self._gap = gap_timeout
        self._handle: asyncio.TimerHandle | None = None
        self._end_at = end_at  # loop time of the request's deadline (None: none)
        self._timeout = timeout  # that deadline in seconds, for the error message
        self._ended: RequestError | None = None
        self._shutdown = shutdown
        self.expired = False  # something is due: the token loop should look
        if shutdown is not None:
            shutdown.watchdogs.add(self)
            if shutdown.ended:
                self.end_now(ShuttingDownError())

    def timeout(self, att: Attempt) -> float:
        if att.whole:
            return self._first + self._gap * att.gen.sampling.max_tokens
        return self._gap if att.got_tokens else self._first

    def deadline(self, att: Attempt) -> float:
        return att.last + self.timeout(att)

    def _live(self) -> list[Attempt]:
        return [a for g in self._gens if (a := g.attempt) is not None and a.live]

    def _earliest(self) -> float | None:
        times = [self.deadline(a) for a in self._live()]
        if self._end_at is not None:
            times.append(self._end_at)
        return min(times) if times else None

    def arm(self) -> None:
        self.expired = self._ended is not None
        if self._handle is not None:
            self._handle.cancel()
        when = self._earliest()
        self._handle = None if when is None else self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        when = self._earliest()
        if when is None:
            return
        if when <= self._loop.time():
            self.expired = True
            self._queue.wake()
        else:
            self._handle = self._loop.call_at(when, self._fire)

    def end_now(self, error: RequestError) -> None:
        """End the request at once with `error` (a shutdown past its grace)."""
        self._ended = error
        self.expired = True
        self._queue.wake()

    def end_error(self) -> RequestError | None:
        """The request's own end, once due: the shutdown's error, or its deadline's."""
        if self._ended is not None:
            return self._ended
        if self._end_at is not None and self._end_at <= self._loop.time():
            return DeadlineExceededError(self._timeout)
        return None

    def overdue(self) -> list[Attempt]:
        now = self._loop.time()
        return [a for a in self._live() if self.deadline(a) <= now]

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._shutdown is not None:
            self._shutdown.watchdogs.discard(self)
