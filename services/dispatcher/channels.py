"""One engine client (gRPC channel) per instance, following fleet's diff events, and draining.

An instance that leaves the routable set (removed from the workers file or by the admin API,
drained, reported down) gets no new streams: `get` no longer returns its client. Its streams
already running go on; the channel closes when the last of them ends. Those still running
after `drain_timeout` are handed to `on_drain_timeout`, which fails them (migratable: the
preprocessor resends them with their tokens so far) and cancels them (an Abort to the engine);
the channel closes once they are gone. An instance that comes back while its client drains
gets that client back, with its streams.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable

from switchyard.common.engines.base import EngineClient
from switchyard.common.engines.connect import client_for
from switchyard.common.engines.tls import EngineTls
from switchyard.protos.messages import (
    InstanceAdded,
    InstanceEvent,
    InstanceRemoved,
    InstanceUpdated,
)

log = logging.getLogger(__name__)

DEFAULT_DRAIN_TIMEOUT = 30.0

Key = Hashable  # what the service calls a stream: (peer, request id)
OnDrainTimeout = Callable[[int, list[Key]], None]


class _Entry:
    __slots__ = ("client", "instance_id", "url", "streams", "timer")

    def __init__(self, client: EngineClient, instance_id: int, url: str) -> None:
        self.client = client
        self.instance_id = instance_id
        self.url = url
        self.streams: set[Key] = set()
        self.timer: asyncio.TimerHandle | None = None  # set while draining


class ChannelPool:
    def __init__(
        self,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        on_drain_timeout: OnDrainTimeout | None = None,
        tls: EngineTls | None = None,
        *,
        http2_streams: bool = True,
    ) -> None:
        if drain_timeout < 0:
            raise ValueError(f"the drain timeout must be >= 0, got {drain_timeout}")
        self.drain_timeout = drain_timeout
        self._on_drain_timeout = on_drain_timeout
        self._tls = tls
        self._http2 = http2_streams  # Generate streams on the loop's HTTP/2 (engines/http2.py)
        self._live: dict[int, _Entry] = {}
        self._draining: dict[int, list[_Entry]] = {}  # instance id -> its draining clients
        self._by_client: dict[int, _Entry] = {}  # id(client) -> entry, live or draining
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, instance_id: int) -> EngineClient | None:
        """The client for a new stream; None when the instance is not routable."""
        entry = self._live.get(instance_id)
        return entry.client if entry is not None else None

    def __len__(self) -> int:
        return len(self._live)

    def draining(self, instance_id: int) -> int:
        """Streams still running on the instance's draining clients."""
        return sum(len(e.streams) for e in self._draining.get(instance_id, ()))

    # ---- streams ------------------------------------------------------------------------

    def attach(self, client: EngineClient, key: Key) -> None:
        self._by_client[id(client)].streams.add(key)

    def detach(self, client: EngineClient, key: Key) -> None:
        entry = self._by_client.get(id(client))
        if entry is None:
            return
        entry.streams.discard(key)
        if not entry.streams and entry.timer is not None:
            log.info(
                "channel drained instance_id=%d url=%s: closing it", entry.instance_id, entry.url
            )
            self._close(entry)

    # ---- fleet events -------------------------------------------------------------------

    def apply(self, events: list[InstanceEvent]) -> None:
        for event in events:
            if isinstance(event, InstanceAdded | InstanceUpdated):
                inst = event.instance
                live: _Entry | None = self._live.get(inst.instance_id)
                if live is not None and live.client.protocol == inst.protocol:
                    continue
                if live is not None:  # another engine family on that URL now
                    self._drain(live)
                revived = self._revive(inst.instance_id, inst.protocol)
                if revived is not None:
                    log.info(
                        "instance_id=%d is back: its draining channel serves again (%d streams)",
                        inst.instance_id,
                        len(revived.streams),
                    )
                    continue
                client = client_for(
                    inst.protocol, inst.url, inst.instance_id, self._tls, http2_streams=self._http2
                )
                entry = _Entry(client, inst.instance_id, inst.url)
                self._live[inst.instance_id] = entry
                self._by_client[id(client)] = entry
                log.info("channel open instance_id=%d url=%s", inst.instance_id, inst.url)
            elif isinstance(event, InstanceRemoved):
                gone = self._live.get(event.instance_id)
                if gone is not None:
                    self._drain(gone)

    def _drain(self, entry: _Entry) -> None:
        """No new streams on `entry`; close it once its streams are done (or past the timeout)."""
        del self._live[entry.instance_id]
        if not entry.streams:
            log.info("channel closed instance_id=%d url=%s", entry.instance_id, entry.url)
            self._close(entry)
            return
        log.info(
            "instance_id=%d url=%s left the routable set: draining its %d stream(s) for up to %gs",
            entry.instance_id,
            entry.url,
            len(entry.streams),
            self.drain_timeout,
        )
        self._draining.setdefault(entry.instance_id, []).append(entry)
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(self.drain_timeout, self._timed_out, entry)

    def _revive(self, instance_id: int, protocol: str) -> _Entry | None:
        for entry in self._draining.get(instance_id, ()):
            if entry.client.protocol == protocol:
                self._forget_draining(entry)
                self._live[instance_id] = entry
                return entry
        return None

    def _timed_out(self, entry: _Entry) -> None:
        if entry.timer is None:
            return
        keys = list(entry.streams)
        log.warning(
            "instance_id=%d url=%s: %d stream(s) still running after the drain timeout (%gs): "
            "failing them to migrate",
            entry.instance_id,
            entry.url,
            len(keys),
            self.drain_timeout,
        )
        if self._on_drain_timeout is not None and keys:
            self._on_drain_timeout(entry.instance_id, keys)
        # The failed streams are cancelled (an Abort each) and detach themselves; the last one
        # closes the channel. With no handler (tests), close now.
        if self._on_drain_timeout is None or not entry.streams:
            self._close(entry)

    def _forget_draining(self, entry: _Entry) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        others = self._draining.get(entry.instance_id, [])
        if entry in others:
            others.remove(entry)
        if not others:
            self._draining.pop(entry.instance_id, None)

    def _close(self, entry: _Entry) -> None:
        self._forget_draining(entry)
        self._by_client.pop(id(entry.client), None)
        task = asyncio.create_task(entry.client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        entries = list(self._live.values()) + [e for es in self._draining.values() for e in es]
        for entry in entries:
            if entry.timer is not None:
                entry.timer.cancel()
        self._live, self._draining, self._by_client = {}, {}, {}
        await asyncio.gather(*self._closing, return_exceptions=True)
        await asyncio.gather(*(e.client.close() for e in entries), return_exceptions=True)
