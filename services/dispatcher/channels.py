"""One engine client (gRPC channel) per instance, following fleet's diff events."""

from __future__ import annotations

import asyncio
import logging

from switchyard.common.engines.base import EngineClient
from switchyard.common.engines.connect import client_for
from switchyard.protos.messages import (
    InstanceAdded,
    InstanceEvent,
    InstanceRemoved,
    InstanceUpdated,
)

log = logging.getLogger(__name__)


class ChannelPool:
    def __init__(self) -> None:
        self._clients: dict[int, EngineClient] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, instance_id: int) -> EngineClient | None:
        return self._clients.get(instance_id)

    def __len__(self) -> int:
        return len(self._clients)

    def apply(self, events: list[InstanceEvent]) -> None:
        for event in events:
            if isinstance(event, InstanceAdded | InstanceUpdated):
                inst = event.instance
                old = self._clients.get(inst.instance_id)
                if old is not None and old.protocol == inst.protocol:
                    continue
                if old is not None:
                    self._close_later(old)
                self._clients[inst.instance_id] = client_for(
                    inst.protocol, inst.url, inst.instance_id
                )
                log.info("channel open instance_id=%d url=%s", inst.instance_id, inst.url)
            elif isinstance(event, InstanceRemoved):
                # Streams already running on this channel keep it until they end or fail;
                # closing it now would cut streams of an instance that is only inhibited.
                client = self._clients.pop(event.instance_id, None)
                if client is not None:
                    log.info("channel closed instance_id=%d url=%s", event.instance_id, event.url)
                    self._close_later(client, delay=30.0)

    def _close_later(self, client: EngineClient, delay: float = 0.0) -> None:
        async def close() -> None:
            await asyncio.sleep(delay)
            await client.close()

        task = asyncio.create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        for task in list(self._closing):
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
