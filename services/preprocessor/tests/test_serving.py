"""GracefulServer's main loop: one tick a second, and out at once on a stop signal."""

from __future__ import annotations

import asyncio
import signal
import time
from types import SimpleNamespace

import uvicorn

from switchyard.preprocessor.serving import TICK_S, GracefulServer


def server() -> GracefulServer:
    async def app(scope, receive, send) -> None:  # never called
        raise AssertionError("no request expected")

    state = SimpleNamespace(stopping=asyncio.Event())
    return GracefulServer(uvicorn.Config(app), state, grace=0.0)  # type: ignore[arg-type]


class TestMainLoop:
    def test_ticks_once_a_second_and_stops_at_once(self):
        """Idle burn (issue 13): uvicorn's own loop woke the process ten times a second."""

        async def run() -> tuple[list[int], float]:
            srv = server()
            ticks: list[int] = []
            on_tick = srv.on_tick

            async def counted(counter: int) -> bool:
                ticks.append(counter)
                return await on_tick(counter)

            srv.on_tick = counted  # type: ignore[method-assign]
            task = asyncio.create_task(srv.main_loop())
            await asyncio.sleep(TICK_S * 1.5)
            srv.handle_exit(signal.SIGTERM, None)
            start = time.monotonic()
            await asyncio.wait_for(task, 1.0)
            return ticks, time.monotonic() - start

        ticks, exit_s = asyncio.run(run())
        # the first tick, one after a second, and the one that sees should_exit
        assert len(ticks) == 3
        assert all(counter % 10 == 0 for counter in ticks)  # each renews the Date header
        assert exit_s < 0.2
