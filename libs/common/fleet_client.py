"""Follow fleet's instance set: what every other service uses to know the engines.

    client = FleetClient(control, events, on_change=router.apply)
    await client.start()          # subscribed, and holding a snapshot
    client.instances              # immutable Mapping[int, Instance], swapped on each change
    await client.report_down(instance_id, errors.CANNOT_CONNECT, "connection refused")
    await client.close()

Sync protocol. SUB to fleet's events first, then ask for a Snapshot on a DEALER (retried, on a
fresh socket each time, until fleet answers); updates that arrive meanwhile are buffered and
the ones newer than the snapshot applied on top of it. After that, updates apply in version
order. An update at or below the snapshot's version is a leftover from before the snapshot and
is skipped; a gap (a missed update, or a version that goes down once the stream has caught up:
a restarted fleet) or a new SUB connection (fleet came back) triggers a fresh snapshot, and the
consumer is told its difference from what it had (`diff_instances`) through `on_change`.

`on_change` runs synchronously in the reader task, once per applied update (or resync) with its
events, after `instances` already shows the result. It must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from switchyard.common.instance_diff import apply_events, diff_instances, index_instances
from switchyard.common.runner import unless_stopped
from switchyard.protos import codec
from switchyard.protos.messages import (
    FleetUpdate,
    Instance,
    InstanceDownReport,
    InstanceEvent,
    Snapshot,
    SnapshotRequest,
)

log = logging.getLogger(__name__)

OnChange = Callable[[list[InstanceEvent]], None]

RETRY_FIRST = 0.2  # seconds before the first snapshot request is retried
RETRY_MAX = 2.0


class FleetClient:
    def __init__(
        self,
        control_endpoint: str,
        events_endpoint: str,
        *,
        on_change: OnChange | None = None,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        """`context`: a shared ZMQ context (left open by close); by default the client
        creates and terminates its own."""
        self._control_endpoint = control_endpoint
        self._events_endpoint = events_endpoint
        self._on_change = on_change
        self._context = context
        self._own_context = context is None
        self._instances: Mapping[int, Instance] = MappingProxyType({})
        self._version: int | None = None
        self._caught_up = False  # an update newer than the last snapshot was applied
        self._syncing = False
        self._pending: list[FleetUpdate] = []  # updates received while syncing
        self._request_outstanding = False
        self._retry_delay = RETRY_FIRST
        self._retry_at = 0.0
        self._synced = asyncio.Event()
        self._sub: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._poller = zmq.asyncio.Poller()
        self._task: asyncio.Task[None] | None = None

    # ---- public -------------------------------------------------------------------------

    @property
    def instances(self) -> Mapping[int, Instance]:
        """The routable set by instance id: a read-only snapshot that is replaced, never
        mutated, on each change (hold on to it and it stays as it was)."""
        return self._instances

    @property
    def version(self) -> int | None:
        """Fleet version `instances` reflects; None before the first snapshot."""
        return self._version

    async def start_unless_stopped(self, stop: asyncio.Event) -> bool:
        """`start()` unless `stop` is set first (a SIGTERM while fleet has not answered yet):
        False then, and the service should end without serving."""
        if await unless_stopped(self.start(), stop):
            return True
        log.info("stopped before fleet answered")
        return False

    async def start(self, timeout: float | None = None) -> None:
        """Connect and wait for the first snapshot (forever when `timeout` is None). Raises
        TimeoutError, after closing, when fleet has not answered within `timeout` seconds."""
        if self._task is not None:
            raise RuntimeError("FleetClient already started")
        if self._context is None:
            self._context = zmq.asyncio.Context()
        sub = self._sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        sub.connect(self._events_endpoint)
        self._poller.register(sub, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._open_dealer()
        log.info("waiting for fleet's first snapshot from %s", self._control_endpoint)
        await self._begin_sync()
        self._task = asyncio.create_task(self._run(), name="fleet-client")
        synced = asyncio.create_task(self._synced.wait())
        try:
            await asyncio.wait(
                {synced, self._task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            synced.cancel()
        if self._task.done():  # the reader died: surface its error
            error = self._task.exception()
            await self.close()
            raise RuntimeError("fleet client reader failed") from error
        if not self._synced.is_set():
            await self.close()
            raise TimeoutError(
                f"fleet at {self._control_endpoint} did not answer within {timeout} s"
            )

    async def report_down(self, instance_id: int, kind: str, detail: str = "") -> None:
        """Tell fleet an instance looks unreachable (kind: a common.errors kind). Returns at
        once: the report is queued, not acknowledged; if it cannot be queued it is dropped
        with a warning (fleet re-probes every instance anyway)."""
        if self._dealer is None:
            raise RuntimeError("FleetClient not started")
        report = InstanceDownReport(instance_id, kind, detail)
        if not await self._send(self._dealer, codec.encode(report)):
            log.warning("fleet unreachable: dropped down report instance_id=%s", instance_id)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sub is not None and self._monitor is not None:
            self._sub.disable_monitor()
        for sock in (self._monitor, self._sub, self._dealer):
            if sock is not None:
                sock.close(linger=0)
        self._monitor = self._sub = self._dealer = None
        if self._own_context and self._context is not None:
            self._context.term()
            self._context = None

    async def __aenter__(self) -> FleetClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ---- reader -------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._follow()
        except Exception:
            log.exception("fleet client reader stopped: instances will no longer change")
            raise

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            timeout = -1
            if self._syncing:
                timeout = max(0, math.ceil((self._retry_at - loop.time()) * 1000))
            ready = dict(await self._poller.poll(timeout))
            if self._monitor in ready:
                await self._drain_monitor()
            if self._dealer in ready:
                await self._drain_control()
            if self._sub in ready:
                await self._drain_updates()
            if self._syncing and loop.time() >= self._retry_at:
                log.debug("no snapshot from fleet yet, asking again")
                self._open_dealer()
                await self._request_snapshot()
                self._retry_delay = min(self._retry_delay * 2, RETRY_MAX)
                self._retry_at = loop.time() + self._retry_delay

    async def _drain_monitor(self) -> None:
        assert self._monitor is not None
        for frames in await self._recv_all(self._monitor):
            if parse_monitor_message(frames)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                # Anything published before this connection is lost to us: resync.
                log.debug("connected to fleet events %s: resyncing", self._events_endpoint)
                await self._begin_sync()

    async def _drain_control(self) -> None:
        assert self._dealer is not None
        for frames in await self._recv_all(self._dealer):
            try:
                reply = codec.fleet_control_reply.decode(frames[-1])
            except msgspec.DecodeError as exc:
                log.warning("undecodable reply from fleet: %s", exc)
                continue
            if isinstance(reply, Snapshot):
                self._request_outstanding = False
                if self._syncing:
                    await self._apply_snapshot(reply)

    async def _drain_updates(self) -> None:
        assert self._sub is not None
        for frames in await self._recv_all(self._sub):
            try:
                update = codec.fleet_update.decode(frames[-1])
            except msgspec.DecodeError as exc:
                log.warning("undecodable fleet update: %s", exc)
                continue
            await self._on_update(update)

    async def _on_update(self, update: FleetUpdate) -> None:
        if self._syncing or self._version is None:
            self._pending.append(update)
        elif update.version == self._version + 1:
            self._caught_up = True
            self._set(apply_events(self._instances, update.events), update.version)
            self._notify(update.events)
        elif update.version <= self._version and not self._caught_up:
            pass  # published before the snapshot we hold
        else:
            log.info(
                "fleet version gap (have %s, got %s): resyncing", self._version, update.version
            )
            await self._begin_sync()
            self._pending.append(update)

    async def _apply_snapshot(self, snapshot: Snapshot) -> None:
        instances, version = index_instances(snapshot.instances), snapshot.version
        pending, self._pending = self._pending, []
        self._syncing = False
        caught_up = gap = False
        for update in pending:
            if update.version <= version:
                continue
            if update.version != version + 1:
                gap = True
                break
            instances, version = apply_events(instances, update.events), update.version
            caught_up = True
        events = diff_instances(self._instances, instances.values())
        self._set(instances, version)
        self._caught_up = caught_up
        self._synced.set()
        log.debug("fleet snapshot version=%s instances=%d", version, len(instances))
        self._notify(events)
        if gap:
            await self._begin_sync()

    # ---- helpers ------------------------------------------------------------------------

    def _set(self, instances: dict[int, Instance], version: int) -> None:
        self._instances = MappingProxyType(instances)  # a new dict each time, never mutated
        self._version = version

    def _notify(self, events: list[InstanceEvent]) -> None:
        if events and self._on_change is not None:
            try:
                self._on_change(events)
            except Exception:
                log.exception("fleet on_change callback failed")

    async def _begin_sync(self) -> None:
        """Ask for a fresh snapshot; a request still in flight is abandoned with its socket,
        so any Snapshot that arrives answers this request."""
        if self._request_outstanding:
            self._open_dealer()
        self._syncing = True
        self._pending = []
        await self._request_snapshot()
        self._retry_delay = RETRY_FIRST
        self._retry_at = asyncio.get_running_loop().time() + self._retry_delay

    async def _request_snapshot(self) -> None:
        assert self._dealer is not None
        self._request_outstanding = await self._send(self._dealer, codec.encode(SnapshotRequest()))

    def _open_dealer(self) -> None:
        assert self._context is not None
        if self._dealer is not None:
            self._poller.unregister(self._dealer)
            self._dealer.close(linger=0)
        dealer = self._dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self._control_endpoint)
        self._poller.register(dealer, zmq.POLLIN)
        self._request_outstanding = False

    @staticmethod
    async def _send(sock: zmq.asyncio.Socket, data: bytes) -> bool:
        try:
            await sock.send(data, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    @staticmethod
    async def _recv_all(sock: zmq.asyncio.Socket) -> list[list[bytes]]:
        messages = []
        while True:
            try:
                messages.append(await sock.recv_multipart(flags=zmq.NOBLOCK))
            except zmq.Again:
                return messages
