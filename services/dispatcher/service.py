"""The dispatcher process: a ZMQ ROUTER taking GenerateRequest/CancelRequest from
preprocessors and streaming TokenDelta ... GenerateFinished (or GenerateFailed) back; an
EmbedRequest answers one Embeddings (or GenerateFailed).

An instance that leaves the routable set drains (channels.py): its streams finish, up to
`drain_timeout`, then fail to migrate. On stop (SIGTERM) the dispatcher lets its streams
finish for up to `shutdown_grace`, then fails those left (migratable, not the engine's
fault: they go on through another dispatcher) and exits."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from switchyard.common import errors
from switchyard.common.engines import frames
from switchyard.common.engines.http2 import Relay
from switchyard.common.engines.tls import EngineTls
from switchyard.common.fleet_client import FleetClient
from switchyard.common.messaging import LoopSocket, bound_endpoint, decode_routed, new_socket
from switchyard.common.ports import PortRange
from switchyard.dispatcher.channels import DEFAULT_DRAIN_TIMEOUT, ChannelPool
from switchyard.dispatcher.embeds import run_embed
from switchyard.dispatcher.metrics import DispatcherMetrics
from switchyard.dispatcher.outbox import Outbox
from switchyard.dispatcher.stall import StallWatch
from switchyard.dispatcher.streams import run_generation
from switchyard.protos import codec
from switchyard.protos.messages import (
    CancelRequest,
    EmbedRequest,
    GenerateFailed,
    GenerateRequest,
    InstanceAdded,
    InstanceEvent,
    InstanceRemoved,
)

log = logging.getLogger(__name__)

# Below the preprocessor's gap timeout (5 s): a frozen engine is caught while its streams
# still run, and its streams that wait for their first token go with them.
DEFAULT_STALL_TIMEOUT = 4.0
DEFAULT_SHUTDOWN_GRACE = 30.0
# How Generate streams reach engines: the loop's own HTTP/2 connection (engines/http2.py: less
# CPU per token than grpc.aio, docs/benchmarks.md) or the grpc.aio channel.
ENGINE_STREAMS_HTTP2 = "http2"
ENGINE_STREAMS = (ENGINE_STREAMS_HTTP2, "grpc")
# Under load, replies to a preprocessor go at most once per this many seconds (see Outbox).
DEFAULT_REPLY_WINDOW = 0.002


class DispatcherService:
    def __init__(
        self,
        bind: str,
        fleet_control: str,
        fleet_events: str,
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
        *,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        tls: EngineTls | None = None,
        engine_streams: str = ENGINE_STREAMS_HTTP2,
        reply_window: float = DEFAULT_REPLY_WINDOW,
    ) -> None:
        if shutdown_grace < 0:
            raise ValueError(f"--shutdown-grace must be >= 0, got {shutdown_grace}")
        self.bind = bind
        # None: off. Else an engine silent on every stream this long has its streams failed.
        self.stall = StallWatch(stall_timeout) if stall_timeout else None
        self.shutdown_grace = shutdown_grace
        self.reply_window = reply_window
        self._by_instance: dict[int, set[tuple[bytes, str]]] = {}
        self.metrics = DispatcherMetrics()
        if engine_streams not in ENGINE_STREAMS:
            raise ValueError(f"--engine-streams must be one of {ENGINE_STREAMS}")
        self.pool = ChannelPool(
            drain_timeout,
            self._fail_drained,
            tls,
            http2_streams=engine_streams == ENGINE_STREAMS_HTTP2,
        )
        self.fleet = FleetClient(fleet_control, fleet_events, on_change=self._on_fleet_change)
        self._ctx = zmq.asyncio.Context()
        self._io: LoopSocket | None = None
        self._outbox: Outbox | None = None
        # (peer identity, request id) -> its generation task
        self._tasks: dict[tuple[bytes, str], asyncio.Task[None]] = {}
        self._instance_of: dict[tuple[bytes, str], int] = {}
        self._background: set[asyncio.Task[None]] = set()
        # Instances reported down and not seen again since: one report per transition, not
        # one per stream that failed on them.
        self._reported_down: set[int] = set()
        # Per instance: what its engine connection calls after a read that relayed token
        # chunks into the outbox's batches (see _relayed).
        self._on_relayed: dict[int, Callable[[int], None]] = {}
        # Per worker (model, URL): its in-flight and generations series, and its engine TTFT
        # series once a request is timed, looked up once rather than per request (prometheus'
        # labels() takes a lock and builds the series' key).
        self._series: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._ttft: dict[tuple[str, str], Callable[[float], None]] = {}

    async def run(
        self,
        stop: asyncio.Event,
        *,
        ports: PortRange | None = None,
        on_bound: Callable[[str], None] | None = None,
    ) -> None:
        """Serve until `stop`; `on_bound(endpoint)` once the socket is bound (a port 0 in
        `bind` searched in `ports`)."""
        sock = new_socket(self._ctx, zmq.ROUTER, bind=self.bind, sync=True, ports=ports)
        self.bind = bound_endpoint(sock)
        if on_bound is not None:
            on_bound(self.bind)
        watchdog: asyncio.Task[None] | None = None
        try:
            if not await self.fleet.start_unless_stopped(stop):
                return
            self.pool.apply(
                [
                    InstanceAdded(i)
                    for i in self.fleet.instances.values()
                    if self.pool.get(i.instance_id) is None
                ]
            )
            log.info("dispatcher ready bind=%s instances=%d", self.bind, len(self.pool))
            self._io = LoopSocket(sock, self._on_message, multipart=True)
            self._outbox = Outbox(self._io, self._peer_gone, self.metrics, self.reply_window)
            watchdog = asyncio.create_task(self._watch_stalls()) if self.stall else None
            await stop.wait()
            await self._finish_streams()
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if self._io is not None:
                self._io.close()
            else:
                sock.close(linger=0)
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.fleet.close()
            await self.pool.close()
            self._ctx.term()

    async def _finish_streams(self) -> None:
        """Stopping: running streams may finish within the grace; the rest fail to migrate
        through another dispatcher (their replies are flushed before the socket closes)."""
        if self._tasks:
            log.info(
                "stopping: letting %d stream(s) finish (up to %gs)",
                len(self._tasks),
                self.shutdown_grace,
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_grace
        while self._tasks and loop.time() < deadline:
            await asyncio.wait(list(self._tasks.values()), timeout=min(0.2, deadline - loop.time()))
        if not self._tasks:
            return
        assert self._outbox is not None
        log.warning("stopping: failing %d stream(s) past the grace", len(self._tasks))
        for (peer, request_id), task in list(self._tasks.items()):
            self._outbox.post(
                peer,
                GenerateFailed(
                    request_id=request_id,
                    instance_id=self._instance_of.get((peer, request_id), 0),
                    kind=errors.DISCONNECTED,
                    message="the dispatcher is shutting down",
                    engine_fault=False,
                ),
            )
            task.cancel()
        self._outbox.flush()

    def _on_message(self, frames: list[bytes]) -> None:
        routed = decode_routed(frames, codec.dispatcher_request, "dispatcher request")
        if routed is None:
            return
        peer, message = routed
        if type(message) is list:  # what the preprocessor had for us in one loop iteration
            for one in message:
                self._on_request(peer, one)
        else:
            self._on_request(peer, message)

    def _on_request(
        self, peer: bytes, message: GenerateRequest | EmbedRequest | CancelRequest
    ) -> None:
        if isinstance(message, GenerateRequest | EmbedRequest):
            try:
                self._start(peer, message)
            except Exception as exc:  # whatever it is, the caller gets its final reply
                log.exception(
                    "cannot start request_id=%s",
                    message.request_id,
                    extra={"request_id": message.request_id},
                )
                self.metrics.errors.labels(errors.ENGINE_ERROR, *self._worker(message)).inc()
                assert self._outbox is not None
                self._outbox.post(
                    peer,
                    GenerateFailed(
                        request_id=message.request_id,
                        instance_id=message.instance_id,
                        kind=errors.ENGINE_ERROR,
                        message=f"internal error in the dispatcher: {type(exc).__name__}: {exc}",
                    ),
                )
        elif isinstance(message, CancelRequest):
            task = self._tasks.get((peer, message.request_id))
            if task is not None:
                task.cancel()

    def _peer_gone(self, peer: bytes) -> None:
        """A preprocessor went away: stop generating for it."""
        for (owner, _), task in list(self._tasks.items()):
            if owner == peer:
                task.cancel()

    def _start(self, peer: bytes, request: GenerateRequest | EmbedRequest) -> None:
        key = (peer, request.request_id)
        assert self._outbox is not None
        post = self._outbox.post

        def send(reply: object) -> None:
            post(peer, reply)

        client = self.pool.get(request.instance_id)
        if client is None:
            failed = GenerateFailed(
                request_id=request.request_id,
                instance_id=request.instance_id,
                kind=errors.CANNOT_CONNECT,
                message=f"instance {request.instance_id} is not known to this dispatcher",
            )
            send(failed)
            return
        if self.stall is not None:
            # Per reply only a counter and a flag: the watchdog reads them (see stall.py).
            activity = self.stall.activity(request.instance_id, asyncio.get_running_loop().time())
            activity.streams += 1

            def send(reply: object) -> None:
                activity.replies += 1
                activity.armed = True
                post(peer, reply)

        metrics = self.metrics
        worker = self._worker(request)
        series = self._series.get(worker)
        if series is None:
            series = self._series[worker] = (
                metrics.in_flight.labels(*worker),
                metrics.generations.labels(*worker),
            )
        in_flight, generations = series
        on_error = metrics.errors.labels

        def count(kind: str) -> None:
            on_error(kind, *worker).inc()

        if isinstance(request, EmbedRequest):
            job = run_embed(client, request, send, self._report_down, count)
        else:
            # A whole reply (stream off) times the first token only when it holds one token
            # (the vLLM prefill leg); else it times the whole generation.
            ttft = None
            if request.stream or request.sampling.max_tokens == 1:
                ttft = self._ttft.get(worker)
                if ttft is None:
                    ttft = self._ttft[worker] = metrics.engine_ttft.labels(*worker).observe
            # Only the C frame reader relays: the Python one's hand-read protobuf costs more
            # per token than protobuf's own decoder (bench/dispatch_path.py).
            relay = None
            if frames.NATIVE:
                relay = Relay(self._outbox.batch(peer), self._relayed(request.instance_id))
            job = run_generation(client, request, send, self._report_down, count, ttft, relay)
        task = asyncio.create_task(job)
        self._tasks[key] = task
        self._instance_of[key] = request.instance_id
        streams = self._by_instance.setdefault(request.instance_id, set())
        streams.add(key)
        pool = self.pool
        pool.attach(client, key)
        generations.inc()
        in_flight.inc()

        def done(_task: asyncio.Task[None]) -> None:
            self._tasks.pop(key, None)
            self._instance_of.pop(key, None)
            streams.discard(key)
            pool.detach(client, key)
            in_flight.dec()
            if self.stall is not None:
                activity.streams -= 1
                if not _task.cancelled() and _task.exception() is None:
                    activity.armed = False  # ended normally: a quiet engine is not stalled

        task.add_done_callback(done)

    def _relayed(self, instance_id: int) -> Callable[[int], None]:
        """What a read of the instance's engine connection calls once it wrote `n` token
        chunks into the outbox's batches: a flush, and the stall watch's activity (as `send`
        does per reply)."""
        hook = self._on_relayed.get(instance_id)
        if hook is not None:
            return hook
        assert self._outbox is not None
        schedule = self._outbox.schedule
        if self.stall is None:

            def hook(n: int) -> None:
                schedule()

        else:
            activity = self.stall.activity(instance_id, asyncio.get_running_loop().time())

            def hook(n: int) -> None:
                activity.replies += n
                activity.armed = True
                schedule()

        self._on_relayed[instance_id] = hook
        return hook

    def _worker(self, request: GenerateRequest | EmbedRequest) -> tuple[str, str]:
        """The (model, worker URL) labels of the engine a request is for."""
        return self._worker_of(request.instance_id)

    def _worker_of(self, instance_id: int) -> tuple[str, str]:
        instance = self.fleet.instances.get(instance_id)
        if instance is None:
            return "", f"instance:{instance_id}"
        return instance.model, instance.url

    async def _watch_stalls(self) -> None:
        assert self.stall is not None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.stall.interval)
            for instance_id in self.stall.check(loop.time()):
                self._fail_stalled(instance_id)

    def _fail_stalled(self, instance_id: int) -> None:
        """Every stream on a silent engine fails now (migratable; the engine is reported)."""
        assert self.stall is not None and self._outbox is not None
        keys = [k for k in self._by_instance.get(instance_id, ()) if not self._tasks[k].done()]
        message = f"the engine produced nothing for {self.stall.timeout:g}s on any stream"
        log.warning(
            "instance_id=%d stalled: %s; failing its %d stream(s)", instance_id, message, len(keys)
        )
        self._report_down(instance_id, errors.TIMEOUT, message)
        worker = self._worker_of(instance_id)
        for peer, request_id in keys:
            self.metrics.errors.labels(errors.TIMEOUT, *worker).inc()
            self._outbox.post(
                peer,
                GenerateFailed(
                    request_id=request_id,
                    instance_id=instance_id,
                    kind=errors.TIMEOUT,
                    message=message,
                ),
            )
            self._tasks[(peer, request_id)].cancel()  # aborts on the engine, sends nothing

    def _fail_drained(self, instance_id: int, keys: list) -> None:  # type: ignore[type-arg]
        """Streams still running on a drained instance past the drain timeout: failed to
        migrate with their tokens so far, and cancelled (an Abort to the engine)."""
        assert self._outbox is not None
        timeout = self.pool.drain_timeout
        for key in keys:
            task = self._tasks.get(key)
            if task is None or task.done():
                continue
            peer, request_id = key
            self.metrics.errors.labels(errors.DISCONNECTED).inc()
            self._outbox.post(
                peer,
                GenerateFailed(
                    request_id=request_id,
                    instance_id=instance_id,
                    kind=errors.DISCONNECTED,
                    message=f"the instance left the routable set and its stream ran past "
                    f"the drain timeout ({timeout:g}s)",
                ),
            )
            task.cancel()

    def _on_fleet_change(self, events: list[InstanceEvent]) -> None:
        self.pool.apply(events)
        for event in events:
            if not isinstance(event, InstanceRemoved):  # back (or changed): report it again
                self._reported_down.discard(event.instance.instance_id)

    def _report_down(self, instance_id: int, kind: str, detail: str) -> None:
        if instance_id in self._reported_down:
            return
        self._reported_down.add(instance_id)
        log.warning("reporting instance down instance_id=%d kind=%s: %s", instance_id, kind, detail)
        self._spawn(self.fleet.report_down(instance_id, kind, detail))

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
