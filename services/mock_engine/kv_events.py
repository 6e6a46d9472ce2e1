"""The engine's KV event publisher: one numbered batch per scheduler step, a replay buffer,
fan-out to the ZMQ PUB socket (listeners) and to gRPC subscribers.

A step: the events emitted during one event-loop iteration (every request whose step ends at
the same wake-up) are closed into one batch by a `call_soon` callback, as the engines publish
one batch per scheduler step, never one per block. Sequence numbers count from 0 per
publisher. Each batch is encoded once; the last `buffer_steps` (batch, payload) pairs are kept
for replay. Listeners get `(seq, payload)`, subscribers the `EventBatch` itself.

Subscribing (`subscribe(start)`, registered before it returns): start 0 is live only ("from
the current state", as SubscribeKvEvents defines it); start N > 0 first replays every buffered
batch numbered >= N, then goes live, with no gap and no duplicate between the two. Resuming
from a sequence older than the buffer raises KvHistoryTruncated.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence

from switchyard.mock_engine.errors import KvHistoryTruncated
from switchyard.mock_engine.types import EventBatch, KvEvent

logger = logging.getLogger(__name__)

Listener = Callable[[int, bytes], None]


class KvEventPublisher:
    def __init__(
        self,
        *,
        encode: Callable[[EventBatch], bytes],
        buffer_steps: int,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._encode = encode
        self._wall_clock = wall_clock
        self._buffer: collections.deque[tuple[EventBatch, bytes]] = collections.deque(
            maxlen=buffer_steps
        )
        self._next_seq = 0
        self._pending: list[KvEvent] = []
        self._flush_scheduled = False
        self._listeners: list[Listener] = []
        self._subscribers: set[asyncio.Queue[EventBatch | None]] = set()
        self._closed = False

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def emit(self, events: Sequence[KvEvent]) -> None:
        """Add events to the current step's batch (closed at the end of this loop iteration)."""
        if not events:
            return
        self._pending.extend(events)
        if self._flush_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._flush_scheduled = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Close the current step's batch now (nothing when it is empty)."""
        self._flush_scheduled = False
        if self._pending:
            events = tuple(self._pending)
            self._pending.clear()
            self._publish(events)

    def publish_now(self, events: Sequence[KvEvent]) -> EventBatch:
        """Publish `events` as a batch of their own (after any pending step)."""
        self.flush()
        return self._publish(tuple(events))

    def _publish(self, events: tuple[KvEvent, ...]) -> EventBatch:
        batch = EventBatch(self._next_seq, self._wall_clock(), events)
        self._next_seq += 1
        payload = self._encode(batch)
        self._buffer.append((batch, payload))
        for listener in self._listeners:
            try:
                listener(batch.seq, payload)
            except Exception:  # one broken transport must not stop the engine
                logger.exception("KV event listener failed seq=%d", batch.seq)
        for queue in self._subscribers:
            queue.put_nowait(batch)
        return batch

    def replay(self, start: int) -> list[tuple[int, bytes]]:
        """(seq, payload) of every buffered batch numbered >= start, oldest first."""
        return [(batch.seq, payload) for batch, payload in self._buffer if batch.seq >= start]

    def buffered(self) -> list[EventBatch]:
        return [batch for batch, _ in self._buffer]

    def subscribe(self, start: int = 0) -> Subscription:
        """Batches from `start` (replayed if > 0), then every new one until `close()`."""
        oldest = self._buffer[0][0].seq if self._buffer else self._next_seq
        if 0 < start < oldest:
            raise KvHistoryTruncated(start, oldest)
        backlog = [batch for batch, _ in self._buffer if batch.seq >= start] if start else []
        queue: asyncio.Queue[EventBatch | None] = asyncio.Queue()
        for batch in backlog:
            queue.put_nowait(batch)
        if self._closed:
            queue.put_nowait(None)
        self._subscribers.add(queue)
        return Subscription(self._subscribers, queue, start)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def close(self) -> None:
        """Publish what is pending and end every subscription (the engine is stopping)."""
        self.flush()
        self._closed = True
        for queue in self._subscribers:
            queue.put_nowait(None)


class Subscription:
    """An async iterator of batches for one subscriber; `close()` unregisters it."""

    def __init__(
        self,
        registry: set[asyncio.Queue[EventBatch | None]],
        queue: asyncio.Queue[EventBatch | None],
        start: int,
    ) -> None:
        self._registry = registry
        self._queue = queue
        self._start = start

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> EventBatch:
        while True:
            item = await self._queue.get()
            if item is None:
                self.close()
                raise StopAsyncIteration
            if item.seq >= self._start:
                return item

    def close(self) -> None:
        self._registry.discard(self._queue)
