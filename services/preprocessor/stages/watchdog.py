"""Notices attempts that went silent, without a timer per token.

An attempt may wait `first_token_timeout` for its first reply (a long prefill is legitimate)
and `gap_timeout` between replies after that (a frozen engine is not). The token loop stamps
each attempt's `last` reply time; the watchdog keeps one timer per request, set for the
earliest deadline and re-armed when it finds the deadline moved, and wakes the token loop
when some attempt is overdue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

from switchyard.preprocessor.reply_queue import ReplyQueue

if TYPE_CHECKING:
    from switchyard.preprocessor.stages.generation import Generation


class Watchdog:
    __slots__ = ("_loop", "_queue", "_gens", "_first", "_gap", "_handle", "expired")

    def __init__(
        self,
        queue: ReplyQueue,
        generations: Iterable[Generation],
        first_token_timeout: float,
        gap_timeout: float,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue = queue
        self._gens = generations
        self._first = first_token_timeout
        self._gap = gap_timeout
        self._handle: asyncio.TimerHandle | None = None
        self.expired = False  # some attempt is overdue: the token loop should look

    def timeout(self, gen: Generation) -> float:
        return self._gap if gen.got_tokens else self._first

    def deadline(self, gen: Generation) -> float:
        return gen.last + (self._gap if gen.got_tokens else self._first)

    def _earliest(self) -> float | None:
        times = [self.deadline(g) for g in self._gens if g.open]
        return min(times) if times else None

    def arm(self) -> None:
        self.expired = False
        if self._handle is not None:
            self._handle.cancel()
        when = self._earliest()
        self._handle = None if when is None else self._loop.call_at(when, self._fire)

    def ensure(self) -> None:
        """Arm the timer if it is not (after a migration re-opened an attempt)."""
        if self._handle is None and not self.expired:
            self.arm()

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

    def overdue(self) -> list[Generation]:
        now = self._loop.time()
        return [g for g in self._gens if g.open and self.deadline(g) <= now]

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
