"""engines.base.both: two calls at once, failures as if made one after the other."""

import asyncio

import pytest

from switchyard.common.engines.base import both


async def test_both_run_at_once_and_keep_their_order():
    started: list[str] = []
    go = asyncio.Event()

    async def call(name: str) -> str:
        started.append(name)
        await go.wait()  # neither finishes before both started
        return name

    task = asyncio.ensure_future(both(call("first"), call("second")))
    while len(started) < 2:
        await asyncio.sleep(0)
    go.set()
    first, second = await task
    assert (first, second()) == ("first", "second")


async def test_the_first_failure_is_raised_at_once_the_second_when_asked():
    async def ok() -> int:
        return 1

    async def fails(message: str) -> int:
        raise ValueError(message)

    with pytest.raises(ValueError, match="first"):
        await both(fails("first"), fails("second"))
    first, second = await both(ok(), fails("second"))
    assert first == 1
    with pytest.raises(ValueError, match="second"):
        second()


async def test_a_cancellation_from_below_is_not_swallowed():
    async def cancelled() -> int:
        raise asyncio.CancelledError

    async def ok() -> int:
        return 1

    with pytest.raises(asyncio.CancelledError):
        await both(ok(), cancelled())
