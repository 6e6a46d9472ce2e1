"""The KV-event sources of every instance, following fleet's Added/Updated/Removed events.

    ingestor = KvIngestor(index, listener=ListenerSpec("bind", "tcp://*:5557"))
    await ingestor.start()                       # binds the listener's rank-0 SUB
    fleet = FleetClient(..., on_change=ingestor.apply_events)   # runs inside the event loop
    ...
    await ingestor.close()

Each data-parallel rank r of an instance is one worker (instance id, r) with its own KvStream
(sequence and replay), fed by whichever transport the engine uses:
- the engine binds its PUB (an advertised `kv_events_endpoint`, wildcard host made
  connectable by fleet): a SUB connected to rank r's endpoint (base port + r); replay at the
  replay endpoint + r;
- the engine connects its PUB to the router (or to a `kv-proxy` the router connects to):
  the listener's rank-r SUB, the engine told apart by the topic the pattern gives it;
- the engine reports (or its worker option says) that its publisher connects to an endpoint
  (`Instance.kv_events_bind`, by the engine's own rule): the router binds a listener there
  (shared by every engine pointed at the same port; the `--kv-events-bind` one when it is the
  same port), the engine told apart by the topic it reports (`Instance.kv_topic`); with
  `--kv-events-proxy` the engines connect to the proxy instead, so the proxy's listener takes
  them.
With a listener, every instance is registered with it as well as connected to when it
advertises an endpoint: an engine has one PUB socket, so only one of the two ever delivers,
and neither the router nor fleet needs to know which way each engine was configured.
Without an advertised endpoint and without a listener: the engine's gRPC SubscribeKvEvents
(every rank in one stream, with load records). None of these: no KV view of that engine.

An Updated instance whose sources did not change keeps them; one whose sources changed gets
new ones, which start from an empty view. Removed stops them and drops the workers, so an
instance (re)admitted by fleet starts from an empty view, which its replay then fills. When
fleet admitted it moments ago (`FRESH_ADMISSION_S`), blocks stored in batches stamped before
its admission are not indexed (see KvStream: warm-up blocks whose AllBlocksCleared the engine
has not published yet); a router that joins an engine admitted long ago takes its whole
replay.

Silence: an instance the router has routed requests to, that has delivered nothing (no live
batch, no replayed batch) `silence_after` seconds after the first of them, is reported once
with a WARNING naming what was expected, and counted (`silent`) until it is heard from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import zmq.asyncio
from smg_grpc_proto.generated import common_pb2

from switchyard.common.engines.base import EngineClient
from switchyard.common.ports import PortRange
from switchyard.protos.messages import Instance, InstanceEvent, InstanceRemoved
from switchyard.router.kv.grpc_source import GrpcKvSource
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.listener import DEFAULT_TOPIC_PATTERN, TopicListener, check_topic_pattern
from switchyard.router.kv.stream import KvStream
from switchyard.router.kv.subscriber import ZmqKvSource, rank_endpoint, resolve_endpoint
from switchyard.router.kv.types import KvCounters, WorkerKey, WorkerKvStats

log = logging.getLogger(__name__)

FRESH_ADMISSION_S = 60.0  # a source started this soon after fleet's admission: cut-off on

OpenClient = Callable[[Instance], EngineClient]
OnLoad = Callable[[WorkerKey, common_pb2.EngineLoad], None]


class _Source(Protocol):
    async def run(self) -> None: ...


def open_engine_client(instance: Instance) -> EngineClient:
    """A client on a channel of its own (the source closes it when it stops)."""
    from switchyard.common.engines.connect import client_for

    return client_for(instance.protocol, instance.url, instance.instance_id)


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """The router's own SUB sockets for engines that connect: `bind` at `endpoint`, or
    `connect` to a kv-proxy backend there."""

    mode: str
    endpoint: str
    topic_pattern: str = DEFAULT_TOPIC_PATTERN

    def __post_init__(self) -> None:
        if self.mode not in ("bind", "connect"):
            raise ValueError(f"listener mode must be bind or connect, got {self.mode!r}")
        check_topic_pattern(self.topic_pattern)

    def topic(self, instance: Instance) -> str:
        parts = urlsplit(instance.url)
        return self.topic_pattern.format(
            host=parts.hostname or "",
            port=parts.port or "",
            model=instance.model,
            instance_id=instance.instance_id,
            url=instance.url,
        )


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """What an instance's sources connect to: equal specs mean the running ones can stay."""

    kind: str  # "zmq" | "grpc"
    ranks: int = 1
    endpoints: tuple[str, ...] = ()  # per rank; empty: listener only
    replay_endpoints: tuple[str | None, ...] = ()
    topic: str | None = None  # the listener's topic for it
    host: str | None = None
    listen: str | None = None  # bind a listener here for it (its publisher connects)
    url: str = ""
    protocol: str = ""


def source_spec(
    instance: Instance, listener: ListenerSpec | None = None, grpc_fallback: bool = True
) -> SourceSpec | None:
    host = urlsplit(instance.url).hostname
    ranks = max(1, instance.dp_size)
    topic = listener.topic(instance) if listener is not None else None
    replay = instance.kv_replay_endpoint
    replays = tuple(
        rank_endpoint(resolve_endpoint(replay, host), r) if replay else None for r in range(ranks)
    )
    if instance.kv_events_bind:
        proxied = listener is not None and listener.mode == "connect"
        if instance.kv_topic is not None:
            topic = instance.kv_topic
        elif topic is None:
            topic = ""  # the engines' default
        listen = None if proxied else instance.kv_events_bind
        return SourceSpec("zmq", ranks, (), replays, topic, host, listen=listen)
    if instance.kv_events_endpoint:
        base = resolve_endpoint(instance.kv_events_endpoint, host)
        endpoints = tuple(rank_endpoint(base, r) for r in range(ranks))
        return SourceSpec("zmq", ranks, endpoints, replays, topic, host)
    if listener is not None:
        return SourceSpec("zmq", ranks, (), replays, topic, host)
    if grpc_fallback:
        return SourceSpec("grpc", ranks, url=instance.url, protocol=instance.protocol)
    return None


@dataclass(slots=True)
class _Running:
    instance: Instance
    spec: SourceSpec
    streams: list[KvStream] = field(default_factory=list)
    grpc: GrpcKvSource | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    listener: TopicListener | None = None
    heard: bool = False
    first_routed: float | None = None
    reported: bool = False


class KvIngestor:
    def __init__(
        self,
        index: KvIndex,
        *,
        context: zmq.asyncio.Context | None = None,
        open_client: OpenClient | None = open_engine_client,
        replay_timeout: float = 2.0,
        listener: ListenerSpec | None = None,
        on_load: OnLoad | None = None,
        silence_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`context`: a shared ZMQ context (left open by close); by default the ingestor
        creates and terminates its own. `open_client` None disables the gRPC fallback."""
        self.index = index
        self._context = context if context is not None else zmq.asyncio.Context()
        self._own_context = context is None
        self._open_client = open_client
        self._replay_timeout = replay_timeout
        self.listener_spec = listener
        self.listener: TopicListener | None = None
        self._on_load = on_load
        self.silence_after = silence_after
        self._clock = clock
        self._wall_clock = wall_clock
        self._ports: PortRange | None = None
        self._listeners: dict[str, TopicListener] = {}  # bound for engines that connect
        self._running: dict[int, _Running] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._closed = False
        self.silent: dict[int, str] = {}  # instance id -> why it is reported silent

    @property
    def counters(self) -> KvCounters:
        return self.index.counters

    async def start(self, ports: PortRange | None = None) -> None:
        """Open the listener's rank-0 socket now, so a bad endpoint fails at start-up (a port
        0 to bind is searched in `ports`)."""
        self._ports = ports
        spec = self.listener_spec
        if spec is not None and self.listener is None:
            self.listener = TopicListener(
                self._context, self.counters, endpoint=spec.endpoint, mode=spec.mode, ports=ports
            )
            self.listener.ensure_ranks(1)

    def streams(self, instance_id: int) -> list[KvStream]:
        """The instance's per-rank streams (empty for a gRPC source or none)."""
        running = self._running.get(instance_id)
        return running.streams if running is not None else []

    def source(self, instance_id: int) -> object | None:
        """The gRPC source, or the rank-0 stream, following an instance (None: none)."""
        running = self._running.get(instance_id)
        if running is None:
            return None
        return running.grpc or (running.streams[0] if running.streams else None)

    def apply_events(self, events: Iterable[InstanceEvent]) -> None:
        """Start, restart or stop sources. Call from inside the event loop; never blocks."""
        if self._closed:
            return
        for event in events:
            if isinstance(event, InstanceRemoved):
                self._stop(event.instance_id)
                self.index.remove_instance(event.instance_id)
                continue
            instance = event.instance
            spec = source_spec(instance, self.listener_spec, self._open_client is not None)
            running = self._running.get(instance.instance_id)
            if running is not None and running.spec == spec:
                running.instance = instance
                continue
            self._stop(instance.instance_id)
            self.index.remove_instance(instance.instance_id)
            if spec is not None:
                self._start(instance, spec)

    # ---- silence ------------------------------------------------------------------------

    def note_routed(self, instance_id: int, now: float, rank: int = 0) -> None:
        """The router sent a request to the instance (the basis of silence and staleness
        reports)."""
        running = self._running.get(instance_id)
        if running is None:
            return
        if running.first_routed is None and not running.heard:
            running.first_routed = now
        if rank < len(running.streams):
            stats = running.streams[rank].stats
            if stats.routed_at is None or (stats.heard_at or 0.0) >= stats.routed_at:
                stats.routed_at = now  # the first since the last event

    def worker_stats(self) -> list[tuple[WorkerKey, WorkerKvStats]]:
        """Each ZMQ-fed worker's stream statistics (gRPC-fed workers have none)."""
        return [
            ((iid, rank), stream.stats)
            for iid, running in self._running.items()
            for rank, stream in enumerate(running.streams)
        ]

    def describe(self, instance_id: int) -> dict[str, object] | None:
        """How the instance's events reach the router (for /debug/kv)."""
        running = self._running.get(instance_id)
        if running is None:
            return None
        spec = running.spec
        return {
            "source": spec.kind,
            "engine_binds": list(spec.endpoints),
            "router_listens": list(running.listener.endpoints) if running.listener else [],
            "topic": spec.topic,
            "replay": [e for e in spec.replay_endpoints if e],
            "heard": running.heard,
        }

    def check_stale(
        self, now: float, running_requests: Callable[[WorkerKey], int], stale_after: float
    ) -> list[WorkerKey]:
        """Suspect the index of a worker stale when no event came for `stale_after` s since a
        request was routed there and requests still run there (`running_requests`: the
        engine's report, else the router's bookkeeping): a new request stores blocks, so
        events stopped. Returns the workers newly suspected (each logged once)."""
        newly = []
        for key, stats in self.worker_stats():
            routed = stats.routed_at
            quiet = (
                routed is not None
                and (stats.heard_at is None or stats.heard_at < routed)
                and now - routed >= stale_after
            )
            busy = running_requests(key) if quiet else 0
            suspected = quiet and busy > 0
            if suspected and not stats.suspected_stale:
                self.counters.stale_suspicions += 1
                newly.append(key)
                age = stats.event_age(now)
                log.warning(
                    "kv index of worker %d/%d suspected stale: no KV event for %s while its "
                    "engine runs %d request(s), routed there %.0f s ago (connected=%s, last "
                    "seq %s): routing may not see its cache",
                    key[0],
                    key[1],
                    "ever" if age is None else f"{age:.0f} s",
                    busy,
                    now - (routed or now),
                    stats.connected,
                    stats.last_seq,
                )
            elif stats.suspected_stale and not suspected:
                log.info("kv index of worker %d/%d: events arriving again", key[0], key[1])
            stats.suspected_stale = suspected
        return newly

    def check_silence(self, now: float | None = None) -> list[int]:
        """Report instances silent past `silence_after`; returns those newly reported."""
        now = self._clock() if now is None else now
        newly = []
        for iid, running in self._running.items():
            if running.heard or running.reported:
                continue
            grpc = running.grpc
            if grpc is not None and grpc.unimplemented:
                why = "its SubscribeKvEvents is UNIMPLEMENTED (no KV-event publisher configured)"
            elif running.first_routed is None or now - running.first_routed < self.silence_after:
                continue
            else:
                why = self._expected(running)
            running.reported = True
            self.silent[iid] = why
            newly.append(iid)
            log.warning(
                "no KV events from instance_id=%d %s (%s): KV-aware routing cannot see its cache",
                iid,
                running.instance.url,
                why
                if grpc is not None and grpc.unimplemented
                else f"{why}, {self.silence_after:.0f} s after the router first sent it a request",
            )
        return newly

    def _expected(self, running: _Running) -> str:
        spec = running.spec
        parts = []
        if spec.endpoints:
            parts.append(f"nothing on its PUB socket {', '.join(spec.endpoints)}")
        if running.listener is not None and spec.topic is not None:
            parts.append(
                f"nothing with topic {spec.topic!r} on the router's "
                f"{', '.join(running.listener.endpoints)}"
            )
        if spec.kind == "grpc":
            parts.append("no batch on its SubscribeKvEvents stream")
        return "; ".join(parts) or "no source"

    def _heard(self, instance_id: int) -> None:
        running = self._running.get(instance_id)
        if running is None or running.heard:
            return
        running.heard = True
        if self.silent.pop(instance_id, None) is not None:
            log.info("KV events from instance_id=%d arriving now", instance_id)

    # ---- lifecycle ----------------------------------------------------------------------

    async def close(self) -> None:
        self._closed = True
        for instance_id in list(self._running):
            self._stop(instance_id)
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        if self.listener is not None:
            await self.listener.close()
        for listener in self._listeners.values():
            await listener.close()
        self._listeners.clear()
        if self._own_context:
            self._context.term()

    def _start(self, instance: Instance, spec: SourceSpec) -> None:
        iid = instance.instance_id
        running = _Running(instance, spec)
        self._running[iid] = running
        loop = asyncio.get_running_loop()

        def contact() -> None:
            self._heard(iid)

        if spec.kind == "grpc":
            if self._open_client is None:  # source_spec gives "grpc" only with a factory
                return
            on_load = self._on_load
            grpc_source = GrpcKvSource(
                iid,
                self._open_client(instance),
                self.index,
                self.counters,
                on_load=(lambda rank, load: on_load((iid, rank), load)) if on_load else None,
            )
            grpc_source.on_contact = contact
            running.grpc = grpc_source
            running.tasks.append(loop.create_task(self._follow(iid, grpc_source), name=f"kv:{iid}"))
            return
        admitted = instance.admitted_at
        fresh = admitted > 0 and self._wall_clock() - admitted < FRESH_ADMISSION_S
        for rank in range(spec.ranks):
            key = (iid, rank)
            self.index.clear_worker(key)
            stream = KvStream(
                key,
                self.index,
                self.counters,
                self._context,
                replay_endpoint=spec.replay_endpoints[rank] if spec.replay_endpoints else None,
                replay_timeout=self._replay_timeout,
                name=f"{iid}/{rank}",
                not_before=admitted if fresh else None,
                clock=self._clock,
                wall_clock=self._wall_clock,
            )
            stream.on_contact = contact
            running.streams.append(stream)
            if spec.endpoints:
                source = ZmqKvSource(
                    stream,
                    self.counters,
                    self._context,
                    endpoint=spec.endpoints[rank],
                )
                running.tasks.append(
                    loop.create_task(self._follow(iid, source), name=f"kv:{iid}/{rank}")
                )
        listener = self._listener_for(spec.listen) if spec.listen else self.listener
        running.listener = listener
        if listener is not None and spec.topic is not None:
            try:
                listener.register(iid, spec.topic, spec.host, running.streams)
            except (zmq.ZMQError, OSError) as exc:
                log.warning("kv events: cannot listen for instance_id=%d: %s", iid, exc)
            for stream in running.streams:  # the engine may be connected already
                stream.start()
        log.debug("kv sources started instance_id=%d spec=%s", iid, spec)

    def _stop(self, instance_id: int) -> None:
        running = self._running.pop(instance_id, None)
        self.silent.pop(instance_id, None)
        if running is None:
            return
        if running.listener is not None:
            running.listener.unregister(instance_id)
        for stream in running.streams:
            stream.stop()  # a read callback due in this loop iteration feeds nothing
        tasks = list(running.tasks)
        for task in tasks:
            task.cancel()  # it never touches the index again: it is not scheduled
        closing = asyncio.get_running_loop().create_task(self._close_streams(running, tasks))
        self._stopping.add(closing)
        closing.add_done_callback(self._stopping.discard)

    def _listener_for(self, endpoint: str) -> TopicListener | None:
        """The listener bound at `endpoint` for engines that connect there: one per port,
        the `--kv-events-bind` one when it has that port (None: it cannot bind; logged)."""
        port = endpoint.rpartition(":")[2]
        own = self.listener
        if own is not None and own.mode == "bind" and own.endpoint.rpartition(":")[2] == port:
            return own
        listener = self._listeners.get(port)
        if listener is None:
            listener = TopicListener(
                self._context, self.counters, endpoint=endpoint, mode="bind", ports=self._ports
            )
            try:
                listener.ensure_ranks(1)
            except (zmq.ZMQError, OSError) as exc:
                log.warning("kv events: cannot bind %s for engines that connect: %s", endpoint, exc)
                return None
            self._listeners[port] = listener
        return listener

    @property
    def listeners(self) -> list[TopicListener]:
        """Every listener: the flag's, then those bound for engines that connect."""
        own = [self.listener] if self.listener is not None else []
        return own + list(self._listeners.values())

    @staticmethod
    async def _close_streams(running: _Running, tasks: list[asyncio.Task[None]]) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in running.streams:
            await stream.close()

    async def _follow(self, instance_id: int, source: _Source) -> None:
        try:
            await source.run()
        except Exception:
            log.exception("kv source failed instance_id=%d: worker view dropped", instance_id)
            self.index.remove_instance(instance_id)
