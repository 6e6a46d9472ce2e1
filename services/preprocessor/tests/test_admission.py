"""Admission control: slots, a bounded FIFO queue, 429 with Retry-After beyond them."""

from __future__ import annotations

import asyncio

import pytest

from switchyard.preprocessor.admission import Admission, Limits
from switchyard.preprocessor.errors import RateLimitError, ShuttingDownError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TestAdmission:
    async def test_slots_then_queue_then_429(self):
        admission = Admission(Limits(max_concurrent=2, max_queued=1, queue_timeout=10))
        first, second = admission.enter(), admission.enter()
        assert first.admitted and second.admitted and admission.running == 2
        waiting = admission.enter()
        assert not waiting.admitted and admission.queued == 1
        with pytest.raises(RateLimitError) as full:
            admission.enter()
        assert full.value.status == 429 and full.value.code == "rate_limit_exceeded"
        assert full.value.retry_after >= 1
        assert admission.rejections["queue_full"] == 1
        first.release()
        await waiting.wait()  # handed the freed slot
        assert waiting.admitted and admission.running == 2 and admission.queued == 0
        for ticket in (second, waiting):
            ticket.release()
            ticket.release()  # idempotent
        assert admission.running == 0

    async def test_waiters_are_served_in_arrival_order(self):
        admission = Admission(Limits(max_concurrent=1, max_queued=5, queue_timeout=10))
        running = admission.enter()
        waiters = [admission.enter() for _ in range(3)]
        order = []

        async def wait(i):
            await waiters[i].wait()
            order.append(i)
            waiters[i].release()

        tasks = [asyncio.create_task(wait(i)) for i in (2, 0, 1)]
        await asyncio.sleep(0)
        running.release()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2]

    async def test_queue_timeout_is_a_429_and_frees_the_place(self):
        admission = Admission(Limits(max_concurrent=1, max_queued=1, queue_timeout=0.05))
        running = admission.enter()
        waiting = admission.enter()
        with pytest.raises(RateLimitError, match="waited"):
            await waiting.wait()
        waiting.release()
        assert admission.queued == 0 and admission.rejections["queue_timeout"] == 1
        again = admission.enter()  # the place is free again
        assert not again.admitted
        again.release()
        running.release()

    async def test_per_key_limit(self):
        admission = Admission(Limits(max_concurrent=0, per_key=2))
        a1, a2 = admission.enter(b"a"), admission.enter(b"a")
        with pytest.raises(RateLimitError, match="API key"):
            admission.enter(b"a")
        admission.enter(b"b").release()  # another key is not held back
        a1.release()
        admission.enter(b"a").release()
        a2.release()

    async def test_close_sends_waiters_and_newcomers_away(self):
        admission = Admission(Limits(max_concurrent=1, max_queued=2, queue_timeout=10))
        running = admission.enter()
        waiting = admission.enter()
        admission.close()
        with pytest.raises(ShuttingDownError):
            await waiting.wait()
        with pytest.raises(ShuttingDownError):
            admission.enter()
        waiting.release()
        running.release()
        assert admission.running == 0 and admission.queued == 0

    async def test_retry_after_follows_the_mean_duration_and_the_queue(self):
        clock = Clock()
        admission = Admission(Limits(max_concurrent=2, max_queued=100, queue_timeout=10), clock)
        for _ in range(60):  # requests of 8 s each
            ticket = admission.enter()
            clock.now += 8.0
            ticket.release()
        holding = [admission.enter(), admission.enter()]
        queued = [admission.enter() for _ in range(9)]
        # ~8 s x (9 ahead + 1) / 2 slots
        assert 30 <= admission.retry_after() <= 41
        for ticket in queued + holding:
            ticket.release()

    def test_limits_are_validated(self):
        for bad in (
            {"max_concurrent": -1},
            {"max_queued": -1},
            {"queue_timeout": 0},
            {"per_key": -1},
        ):
            with pytest.raises(ValueError):
                Limits(**bad)
