"""Uvicorn with a graceful stop, the admin listener in plain HTTP beside an HTTPS API
listener (uvicorn would give every socket its one TLS context), and standby sockets.

The graceful stop: on SIGTERM the listeners close (no new connections), queued requests get
503 (retry elsewhere), running ones may finish within `--shutdown-grace`; past it every one
still running is ended cleanly (an error event in a stream, a 503 before its first byte; its
engine requests aborted), and the process exits once they are answered.

Standby sockets (siblings' listeners, standby.py): connections taken from them once the
server started are served by the same HTTP protocol (and TLS) as its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from types import FrameType

import uvicorn

from switchyard.preprocessor.standby import Standby
from switchyard.preprocessor.state import PreprocessorState

log = logging.getLogger(__name__)

BACKSTOP_S = 5.0  # after the grace, uvicorn cancels what still did not answer
TICK_S = 1.0  # uvicorn's tick: the Date header is renewed at each


class GracefulServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        state: PreprocessorState,
        grace: float,
        standby: list[socket.socket] | None = None,
    ) -> None:
        config.timeout_graceful_shutdown = int(grace + BACKSTOP_S + 0.999)
        super().__init__(config)
        self._state = state
        self._grace = grace
        # Served without TLS whatever config.ssl says: the admin listener (loopback).
        self.plain_sockets: list[socket.socket] = []
        self._standby_sockets = standby or []
        self._standby: Standby | None = None
        self._handovers: set[asyncio.Task[object]] = set()

    def _protocol(self) -> asyncio.Protocol:
        """An HTTP protocol instance, as uvicorn makes one for its own listeners."""
        config = self.config
        return config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=self.server_state, app_state=self.lifespan.state
        )

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # the lifespan (ready), then our own listeners
        if self.should_exit or not self.started:
            return
        loop = asyncio.get_running_loop()
        for sock in self.plain_sockets:
            server = await loop.create_server(
                self._protocol, sock=sock, backlog=self.config.backlog
            )
            self.servers.append(server)
        if self._standby_sockets:
            taken = self._state.metrics.taken_over.inc
            self._standby = Standby(self._standby_sockets, self._serve_taken, on_taken=taken)
            self._standby.start()

    def _serve_taken(self, conn: socket.socket) -> None:
        """Serve a connection accepted from a sibling's socket as uvicorn serves its own."""
        loop = asyncio.get_running_loop()
        accepted = loop.connect_accepted_socket(self._protocol, conn, ssl=self.config.ssl)
        task = loop.create_task(accepted)
        self._handovers.add(task)
        task.add_done_callback(self._handed_over)

    def _handed_over(self, task: asyncio.Task[object]) -> None:
        self._handovers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("a connection taken over failed to start: %s", task.exception())

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn only looks at should_exit once the start-up is over; the start-up's own
        # waits (fleet not answering yet) give up on this event. Signal handlers run on the
        # loop's thread, between its callbacks.
        with contextlib.suppress(RuntimeError):  # no loop running yet
            loop = asyncio.get_running_loop()
            loop.call_soon_threadsafe(self._state.stopping.set)

    async def main_loop(self) -> None:
        """uvicorn's loop wakes every 0.1 s to notice should_exit (and renews the Date header
        every tenth wake-up); here it wakes once a second, or at once when a stop signal sets
        `stopping`: an idle preprocessor's loop wakes 1 time a second instead of 10."""
        stopping = self._state.stopping
        counter = 0  # uvicorn's on_tick renews the Date header when counter % 10 == 0
        while not await self.on_tick(counter):
            if stopping.is_set():  # set, yet uvicorn is not exiting: tick as uvicorn does
                await asyncio.sleep(0.1)
                counter = (counter + 1) % 864000
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await stopping.wait()
            counter = 0

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._standby is not None:
            self._standby.close()
        state = self._state
        state.admission.close()
        log.info(
            "stopping: no new connections; %d request(s) running may finish within %gs",
            state.admission.running,
            self._grace,
        )
        timer = asyncio.get_running_loop().call_later(self._grace, self._end)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _end(self) -> None:
        ended = self._state.deps.shutdown.end_all()
        if ended:
            log.warning("shutdown grace (%gs) over: ending %d request(s)", self._grace, ended)
