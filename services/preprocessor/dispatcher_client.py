"""The preprocessor's side of the dispatcher channel.

One DEALER per dispatcher replica; each generation stays on the replica it started on (its
cancel must reach the same one). Replies are fanned out to per-request queues by the reader.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from switchyard.common.messaging import DealerClient
from switchyard.protos import codec
from switchyard.protos.messages import CancelRequest, GenerateRequest


class _Replica(DealerClient):
    def __init__(self, endpoint: str, streams: dict[str, asyncio.Queue[Any]]) -> None:
        super().__init__(endpoint, codec.dispatcher_reply)
        self._streams = streams

    def handle(self, reply: Any) -> None:
        queue = self._streams.get(reply.request_id)
        if queue is not None:
            queue.put_nowait(reply)


class GenerationStream:
    """Replies of one generation: TokenDelta..., then GenerateFinished or GenerateFailed."""

    def __init__(self, client: DispatcherClient, replica: _Replica, request_id: str) -> None:
        self._client = client
        self._replica = replica
        self.request_id = request_id
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self._open = True

    async def cancel(self) -> None:
        if self._open:
            self.close()
            await self._replica.send(CancelRequest(self.request_id))

    def close(self) -> None:
        if self._open:
            self._open = False
            self._client.streams.pop(self.request_id, None)


class DispatcherClient:
    def __init__(self, endpoints: list[str]) -> None:
        if not endpoints:
            raise ValueError("at least one dispatcher endpoint is needed")
        self.streams: dict[str, asyncio.Queue[Any]] = {}
        self._replicas = [_Replica(e, self.streams) for e in endpoints]
        self._next = itertools.cycle(self._replicas)

    def start(self) -> None:
        for replica in self._replicas:
            replica.start()

    async def open(self, request: GenerateRequest) -> GenerationStream:
        replica = next(self._next)
        stream = GenerationStream(self, replica, request.request_id)
        self.streams[request.request_id] = stream.queue
        await replica.send(request)
        return stream

    async def close(self) -> None:
        for replica in self._replicas:
            await replica.close()
