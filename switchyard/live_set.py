"""What `switchyard up` says it serves: the engines fleet has routable now, followed as they
change (an engine added or drained through the admin API, one that died or came back), not
the list it was started with.

A FleetClient on a thread of its own (its own event loop and ZMQ context): it sleeps until
fleet publishes, so following costs `up` nothing while the set stays as it is.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping

from switchyard.common.fleet_client import FleetClient
from switchyard.protos.messages import Instance, InstanceAdded, InstanceEvent, InstanceRemoved

log = logging.getLogger("switchyard.up")

START_TIMEOUT_S = 10.0


def engines_text(instances: Mapping[int, Instance]) -> str:
    urls = sorted(i.url for i in instances.values())
    return ", ".join(urls) if urls else "none routable"


def change_text(events: list[InstanceEvent]) -> str:
    """`+grpc://a -grpc://b`: what an update added and removed (updates left out)."""
    parts = []
    for event in events:
        if isinstance(event, InstanceRemoved):
            parts.append(f"-{event.url}")
        elif isinstance(event, InstanceAdded):
            parts.append(f"+{event.instance.url}")
    return " ".join(parts)


class LiveSet:
    """Follows fleet's routable set on a thread; `on_change(text)` is called there (with
    engines_text of the new set) after each change that adds or removes an engine."""

    def __init__(
        self, control: str, events: str, on_change: Callable[[str, str], None] | None = None
    ) -> None:
        self._control, self._events = control, events
        self._on_change = on_change or _log_change
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._text = ""
        self._thread = threading.Thread(target=self._run, name="live-set", daemon=True)

    def start(self) -> str:
        """Start following; returns the engines of fleet's first snapshot ('' when fleet did
        not answer within START_TIMEOUT_S: the thread keeps trying)."""
        self._thread.start()
        self._started.wait(START_TIMEOUT_S)
        return self._text

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        asyncio.run(self._follow())

    async def _follow(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        client: FleetClient | None = None

        def changed(events: list[InstanceEvent]) -> None:
            change = change_text(events)
            if client is None or not self._started.is_set() or not change:
                return
            self._text = engines_text(client.instances)
            self._on_change(self._text, change)

        client = FleetClient(self._control, self._events, on_change=changed)
        try:
            starting = asyncio.create_task(client.start())
            stopping = asyncio.create_task(self._stop.wait())
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done() and not starting.cancelled() and starting.exception() is None:
                self._text = engines_text(client.instances)
                self._started.set()
                await self._stop.wait()
            starting.cancel()
            stopping.cancel()
        finally:
            self._started.set()
            await client.close()


def _log_change(text: str, change: str) -> None:
    log.info("engines changed (%s): now serving with %s", change, text)
