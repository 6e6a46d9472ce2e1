"""Uvicorn with a graceful stop: on SIGTERM the listeners close (no new connections), queued
requests get 503 (retry elsewhere), running ones may finish within `--shutdown-grace`; past it
every one still running is ended cleanly (an error event in a stream, a 503 before its first
byte; its engine requests aborted), and the process exits once they are answered."""

from __future__ import annotations

import asyncio
import logging
import socket

import uvicorn

from switchyard.preprocessor.state import PreprocessorState

log = logging.getLogger(__name__)

BACKSTOP_S = 5.0  # after the grace, uvicorn cancels what still did not answer


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: PreprocessorState, grace: float) -> None:
        config.timeout_graceful_shutdown = int(grace + BACKSTOP_S + 0.999)
        super().__init__(config)
        self._state = state
        self._grace = grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
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
