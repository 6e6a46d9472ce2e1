"""The watchdog's one timer per request: silent attempts, the request's deadline, a shutdown."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from switchyard.preprocessor.errors import DeadlineExceededError, ShuttingDownError
from switchyard.preprocessor.reply_queue import ReplyQueue
from switchyard.preprocessor.stages.watchdog import Shutdown, Watchdog


def attempt(
    last: float, got_tokens: bool = True, whole: bool = False, max_tokens: int = 16
) -> SimpleNamespace:
    """A live attempt; its generation (what the watchdog watches) is `.gen`."""
    att = SimpleNamespace(live=True, got_tokens=got_tokens, last=last, whole=whole)
    att.gen = SimpleNamespace(sampling=SimpleNamespace(max_tokens=max_tokens), attempt=att)
    return att


class TestWatchdog:
    async def test_silent_attempt_is_overdue(self):
        loop = asyncio.get_running_loop()
        queue = ReplyQueue()
        att = attempt(loop.time())
        watchdog = Watchdog(queue, [att.gen], 60.0, 0.05)
        watchdog.arm()
        await asyncio.wait_for(queue.wait(), 10)  # woken by the timer
        assert watchdog.expired and watchdog.overdue() == [att]
        assert watchdog.end_error() is None  # the request itself has no deadline
        watchdog.cancel()

    async def test_a_whole_attempt_may_take_what_a_stream_could_at_the_longest(self):
        """Silent by design: first-token timeout + max_tokens x gap timeout (1 + 16 x 2 s)."""
        loop = asyncio.get_running_loop()
        queue = ReplyQueue()
        now = loop.time()
        whole = attempt(now - 30.0, got_tokens=False, whole=True)
        watchdog = Watchdog(queue, [whole.gen], 1.0, 2.0)
        watchdog.arm()
        assert watchdog.overdue() == [] and watchdog.deadline(whole) == now + 3.0
        whole.last = now - 34.0
        assert watchdog.overdue() == [whole] and watchdog.timeout(whole) == 33.0
        watchdog.cancel()

    async def test_a_deadline_that_moved_later_is_found_when_the_timer_fires(self):
        """The token loop does not re-arm for a whole attempt's reply (its timeout does not
        change with it): the timer, armed for the old deadline, re-arms for the new one."""
        loop = asyncio.get_running_loop()
        queue = ReplyQueue()
        whole = attempt(loop.time(), got_tokens=False, whole=True, max_tokens=1)
        watchdog = Watchdog(queue, [whole.gen], 0.02, 0.01)
        watchdog.arm()  # due in 0.03 s
        whole.last = loop.time() + 60.0  # a reply came: due a minute later
        await asyncio.sleep(0.05)  # the timer (due first) has fired by now
        assert not watchdog.expired and queue.qsize() == 0 and watchdog.overdue() == []
        assert watchdog._handle is not None  # re-armed: it still watches the attempt
        watchdog.cancel()

    async def test_deadline_wakes_the_loop_and_ends_the_request(self):
        loop = asyncio.get_running_loop()
        queue = ReplyQueue()
        att = attempt(loop.time())  # busy: its gap timeout is far away
        watchdog = Watchdog(queue, [att.gen], 60.0, 60.0, end_at=loop.time() + 0.05, timeout=7.0)
        watchdog.arm()
        assert watchdog.end_error() is None
        await asyncio.wait_for(queue.wait(), 10)
        error = watchdog.end_error()
        assert isinstance(error, DeadlineExceededError) and error.status == 504
        assert "7s" in error.message and watchdog.overdue() == []
        watchdog.cancel()

    async def test_deadline_with_no_attempt_open(self):
        loop = asyncio.get_running_loop()
        queue = ReplyQueue()
        watchdog = Watchdog(queue, [], 60.0, 60.0, end_at=loop.time() + 0.02, timeout=1.0)
        watchdog.arm()
        await asyncio.wait_for(queue.wait(), 10)
        assert isinstance(watchdog.end_error(), DeadlineExceededError)
        watchdog.cancel()

    async def test_shutdown_ends_every_running_request(self):
        loop = asyncio.get_running_loop()
        shutdown = Shutdown()
        queues = [ReplyQueue(), ReplyQueue()]
        dogs = [
            Watchdog(q, [attempt(loop.time()).gen], 60.0, 60.0, shutdown=shutdown) for q in queues
        ]
        for dog in dogs:
            dog.arm()
        waits = [asyncio.create_task(q.wait()) for q in queues]
        await asyncio.sleep(0)
        assert shutdown.end_all() == 2
        await asyncio.wait_for(asyncio.gather(*waits), 10)
        for dog in dogs:
            assert dog.expired and isinstance(dog.end_error(), ShuttingDownError)
            dog.cancel()
        assert not shutdown.watchdogs
        late = Watchdog(ReplyQueue(), [], 60.0, 60.0, shutdown=shutdown)
        assert isinstance(late.end_error(), ShuttingDownError)  # after the end: at once
        late.cancel()
