"""Process entry shared by every service: uvloop, and a clean stop on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency; keep the fallback honest
    uvloop = None  # type: ignore[assignment]


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run `main(stop)` on uvloop; SIGINT/SIGTERM set `stop`, and main cleans up and returns."""

    async def wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    if uvloop is not None:
        uvloop.run(wrapper())
    else:
        asyncio.run(wrapper())
    return 0


async def unless_stopped(awaitable: Awaitable[object], stop: asyncio.Event) -> bool:
    """Await `awaitable` unless `stop` is set first, then cancel it: True when it finished.
    For the waits before a service serves (fleet not answering yet), so a SIGTERM then still
    stops the process at once instead of after the supervisor's kill timeout."""
    task = asyncio.ensure_future(awaitable)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        stopping.cancel()
    if task.done():
        task.result()  # its error, if it failed
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False
