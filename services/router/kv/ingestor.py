"""One KV-event source per instance, following fleet's Added/Updated/Removed events.

    ingestor = KvIngestor(index)
    fleet = FleetClient(..., on_change=ingestor.apply_events)   # runs inside the event loop
    ...
    await ingestor.close()

Source per instance: a ZmqKvSource when the instance has a `kv_events_endpoint` (a wildcard
bind address is made connectable with the host of the instance's URL; likewise the replay
endpoint), else a GrpcKvSource on the engine's SubscribeKvEvents (when `open_client` is given;
by default a channel of its own to the engine's URL), else none. An Updated instance whose
endpoints did not change keeps its source; one whose endpoints changed gets a new source,
which starts from an empty view of the worker. Removed stops the source and drops the worker
from the index.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import zmq.asyncio

from switchyard.common.engines.base import EngineClient
from switchyard.protos.messages import Instance, InstanceEvent, InstanceRemoved
from switchyard.router.kv.grpc_source import GrpcKvSource
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.subscriber import ZmqKvSource, resolve_endpoint
from switchyard.router.kv.types import KvCounters

log = logging.getLogger(__name__)

OpenClient = Callable[[Instance], EngineClient]


class _Source(Protocol):
    async def run(self) -> None: ...


def open_engine_client(instance: Instance) -> EngineClient:
    """A client on a channel of its own (the source closes it when it stops)."""
    from switchyard.common.engines.connect import client_for

    return client_for(instance.protocol, instance.url, instance.instance_id)


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """What a source connects to: equal specs mean the running source can stay."""

    kind: str  # "zmq" | "grpc"
    endpoint: str  # the SUB endpoint, or the engine URL
    replay_endpoint: str | None = None
    protocol: str = ""


def source_spec(instance: Instance, grpc_fallback: bool = True) -> SourceSpec | None:
    host = urlsplit(instance.url).hostname
    if instance.kv_events_endpoint:
        replay = instance.kv_replay_endpoint
        return SourceSpec(
            "zmq",
            resolve_endpoint(instance.kv_events_endpoint, host),
            resolve_endpoint(replay, host) if replay else None,
        )
    if grpc_fallback:
        return SourceSpec("grpc", instance.url, protocol=instance.protocol)
    return None


@dataclass(slots=True)
class _Running:
    spec: SourceSpec
    source: _Source
    task: asyncio.Task[None]


class KvIngestor:
    def __init__(
        self,
        index: KvIndex,
        *,
        context: zmq.asyncio.Context | None = None,
        open_client: OpenClient | None = open_engine_client,
        replay_timeout: float = 2.0,
    ) -> None:
        """`context`: a shared ZMQ context (left open by close); by default the ingestor
        creates and terminates its own. `open_client` None disables the gRPC fallback."""
        self.index = index
        self._context = context if context is not None else zmq.asyncio.Context()
        self._own_context = context is None
        self._open_client = open_client
        self._replay_timeout = replay_timeout
        self._running: dict[int, _Running] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def counters(self) -> KvCounters:
        return self.index.counters

    def source(self, instance_id: int) -> object | None:
        """The source following an instance (None when it has none)."""
        running = self._running.get(instance_id)
        return running.source if running is not None else None

    def apply_events(self, events: Iterable[InstanceEvent]) -> None:
        """Start, restart or stop sources. Call from inside the event loop; never blocks."""
        if self._closed:
            return
        for event in events:
            if isinstance(event, InstanceRemoved):
                self._stop(event.instance_id)
                self.index.remove_worker(event.instance_id)
                continue
            instance = event.instance
            spec = source_spec(instance, self._open_client is not None)
            running = self._running.get(instance.instance_id)
            if running is not None and running.spec == spec:
                continue
            self._stop(instance.instance_id)
            if spec is None:
                self.index.remove_worker(instance.instance_id)
            else:
                self._start(instance, spec)

    async def close(self) -> None:
        self._closed = True
        for instance_id in list(self._running):
            self._stop(instance_id)
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        if self._own_context:
            self._context.term()

    # ---- internals ----------------------------------------------------------------------

    def _start(self, instance: Instance, spec: SourceSpec) -> None:
        iid = instance.instance_id
        source: _Source
        if spec.kind == "zmq":
            source = ZmqKvSource(
                iid,
                self.index,
                self.index.counters,
                self._context,
                endpoint=spec.endpoint,
                replay_endpoint=spec.replay_endpoint,
                replay_timeout=self._replay_timeout,
            )
        elif self._open_client is not None:
            client = self._open_client(instance)
            source = GrpcKvSource(iid, client, self.index, self.index.counters)
        else:  # source_spec gives "grpc" only with a client factory
            return
        task = asyncio.get_running_loop().create_task(
            self._follow(iid, source), name=f"kv-events:{iid}"
        )
        self._running[iid] = _Running(spec, source, task)
        log.debug("kv source started instance_id=%d spec=%s", iid, spec)

    def _stop(self, instance_id: int) -> None:
        running = self._running.pop(instance_id, None)
        if running is None:
            return
        running.task.cancel()  # it never touches the index again: it is not scheduled
        self._stopping.add(running.task)
        running.task.add_done_callback(self._stopping.discard)

    async def _follow(self, instance_id: int, source: _Source) -> None:
        try:
            await source.run()
        except Exception:
            log.exception("kv source failed instance_id=%d: worker view dropped", instance_id)
            self.index.clear_worker(instance_id)
