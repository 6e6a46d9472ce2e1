"""Process entry shared by every service: uvloop, and a clean stop on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
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
