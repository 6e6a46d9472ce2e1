"""Probe one configured worker: detect its family once, then ask it for its info each cycle.

The engine client is cached per URL. Its family is detected over a gRPC channel; the probes
(their four calls at once) then go over the client's own HTTP/2 connection
(EngineClient._unary: less CPU than gRPC core's threads and timers; docs/benchmarks.md,
"Engine connections"), and the channel is closed (opened again only if a call needs it). Both
reconnect by themselves when an engine restarts, so only a change of family (the URL now
answers UNIMPLEMENTED) drops the client. `retain` closes the clients of workers that are no
longer configured.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection

from switchyard.common import engines, errors
from switchyard.common.engines import EngineClient, EngineInfo
from switchyard.common.engines.base import both
from switchyard.common.errors import EngineError
from switchyard.common.workers import WorkerSpec

log = logging.getLogger(__name__)

Connect = Callable[..., Awaitable[EngineClient]]


class Prober:
    def __init__(self, timeout: float = 2.0, connect: Connect = engines.connect) -> None:
        self._timeout = timeout
        self._connect = connect
        self._clients: dict[str, EngineClient] = {}

    async def probe(self, spec: WorkerSpec) -> EngineInfo:
        """HealthCheck + GetModelInfo + GetServerInfo, all within the probe timeout. Raises
        EngineError (kind timeout, cannot_connect, ...)."""
        try:
            async with asyncio.timeout(self._timeout):
                return await self._probe(spec)
        except TimeoutError:
            raise EngineError(
                errors.TIMEOUT, f"no answer within {self._timeout} s", spec.instance_id
            ) from None

    async def _probe(self, spec: WorkerSpec) -> EngineInfo:
        client = self._clients.get(spec.url)
        if client is None:
            client = await self._connect(spec.url, self._timeout, spec.instance_id)
            self._clients[spec.url] = client
        try:
            # At once: one round trip per probe, not four (see both).
            healthy, info = await both(
                client.health(self._timeout), client.info(self._timeout)
            )
            if not healthy:
                raise EngineError(errors.ENGINE_ERROR, "engine reports unhealthy", spec.instance_id)
            return info()
        except EngineError as exc:
            if exc.kind == errors.BAD_REQUEST:  # a different engine family took this URL
                await self._drop(spec.url)
            raise

    async def retain(self, urls: Collection[str]) -> None:
        """Close the cached clients of every URL not in `urls`."""
        for url in [url for url in self._clients if url not in urls]:
            await self._drop(url)

    async def close(self) -> None:
        await self.retain(())

    async def _drop(self, url: str) -> None:
        client = self._clients.pop(url, None)
        if client is not None:
            log.debug("closing channel to %s", url)
            await client.close()
