from __future__ import annotations

import asyncio

import pytest

from switchyard.common.runner import unless_stopped


async def test_a_wait_that_finishes_first_is_true() -> None:
    assert await unless_stopped(asyncio.sleep(0), asyncio.Event())


async def test_a_stop_first_cancels_the_wait() -> None:
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    stop = asyncio.Event()
    asyncio.get_running_loop().call_soon(stop.set)
    assert not await unless_stopped(forever(), stop)
    assert cancelled.is_set()


async def test_an_error_of_the_wait_is_raised() -> None:
    async def fails() -> None:
        raise ValueError("no fleet")

    with pytest.raises(ValueError, match="no fleet"):
        await unless_stopped(fails(), asyncio.Event())


async def test_cancelling_the_caller_cancels_the_wait() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.create_task(unless_stopped(forever(), asyncio.Event()))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(cancelled.wait(), 5)
