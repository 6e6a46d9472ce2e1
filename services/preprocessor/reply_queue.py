"""The replies of one HTTP request's engine streams, in arrival order (hot path).

The dispatcher client's reader appends every reply of every generation of a request here
(all its choices and attempts share one queue); the token loop takes everything that arrived
in one go (`take`) and sleeps in `wait` when there is nothing, so it pays one wake-up per batch
of replies, not per reply, and no timer per token. `wake` ends a `wait` early (the stream
watchdog). `get` reads one reply, for the prefill hop's legs.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class ReplyQueue:
    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)

    def take(self) -> deque[Any]:
        """Every reply queued so far (the queue is empty after)."""
        items = self._items
        self._items = deque()
        return items

    def get_nowait(self) -> Any:
        """The oldest reply; IndexError when there is none."""
        return self._items.popleft()

    async def wait(self) -> None:
        """Until a reply is queued or `wake` is called."""
        if self._items:
            return
        waiter = self._waiter
        if waiter is None or waiter.done():
            waiter = self._waiter = asyncio.get_running_loop().create_future()
        await waiter

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Any:
        while not self._items:
            await self.wait()
        return self._items.popleft()
