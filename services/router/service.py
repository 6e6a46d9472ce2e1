"""The router process: follows fleet, ingests the engines' KV events, polls their load,
answers RouteRequest on a ZMQ ROUTER socket, inline in the socket's read callback (no task or
queue per request); a decision's metrics are recorded after its answer went out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from smg_grpc_proto.generated import common_pb2

from switchyard.common.engines.connect import client_for
from switchyard.common.engines.tls import EngineTls
from switchyard.common.fleet_client import FleetClient
from switchyard.common.flow.config import FlowConfig
from switchyard.common.messaging import LoopSocket, bound_endpoint, decode_routed, new_socket
from switchyard.common.ports import PortRange
from switchyard.protos import codec
from switchyard.protos.messages import (
    FlowAdmit,
    FlowDecision,
    FlowRelease,
    FlowStatus,
    FlowStatusRequest,
    FlowSync,
    InstanceAdded,
    InstanceBusy,
    InstanceEvent,
    KvDebugReply,
    KvDebugRequest,
    RouteProgress,
    RouteRequest,
    RouteResponse,
    RouterRequest,
)
from switchyard.router import kv_debug
from switchyard.router.core import RouterCore
from switchyard.router.flow import FlowService, no_gate
from switchyard.router.kv.ingestor import KvIngestor, ListenerSpec
from switchyard.router.load_poller import LoadPoller, poll_clients
from switchyard.router.metrics import RouterMetrics
from switchyard.router.types import Needs, WorkerKey

log = logging.getLogger(__name__)

_SILENCE_CHECK_S = 5.0


@dataclass(frozen=True, slots=True)
class _Decided:
    """A route decision whose metrics are recorded once its answer went out."""

    request: RouteRequest
    response: RouteResponse
    now: float  # the clock the decision was made at
    seconds: float  # how long the decision took (the latency histogram)


class RouterService:
    def __init__(
        self,
        core: RouterCore,
        bind: str,
        fleet_control: str,
        fleet_events: str,
        metrics: RouterMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        listener: ListenerSpec | None = None,
        load_poll_interval: float = 0.5,
        silence_after: float = 30.0,
        stale_after: float = 30.0,
        tls: EngineTls | None = None,
        flow: FlowConfig | None = None,
    ) -> None:
        self.core = core
        self.bind = bind
        self.stale_after = stale_after  # 0: no staleness suspicions
        self.clock = clock
        self._ctx = zmq.asyncio.Context()
        # Only plugins that read the KV view need the engines' events; only those that read
        # engine load need the polls.
        self.ingestor = (
            KvIngestor(
                core.index,
                context=self._ctx,
                listener=listener,
                on_load=self._on_load,
                silence_after=silence_after,
                clock=clock,
                open_client=lambda i: client_for(i.protocol, i.url, i.instance_id, tls),
            )
            if core.needs & Needs.BLOCKS
            else None
        )
        self.poller = (
            LoadPoller(
                core.engine_loads,
                load_poll_interval,
                clock=clock,
                open_client=poll_clients(tls),
            )
            if core.needs & Needs.ENGINE_LOAD and load_poll_interval > 0
            else None
        )
        ingestor = self.ingestor
        self.fleet = FleetClient(fleet_control, fleet_events, on_change=self._on_fleet_change)
        self.metrics = metrics or RouterMetrics(
            core.index,
            core.stats,
            (lambda: len(ingestor.silent)) if ingestor is not None else None,
            lambda: self.fleet.instances,
            core.tracker,
            kv_workers=(lambda: ingestor.worker_stats()) if ingestor is not None else None,
            clock=clock,
        )
        self._sock: LoopSocket | None = None
        self._pending_debug: list[KvDebugRequest] = []
        # The deployment's flow gate (--flow-config; see flow.py).
        self.flow = (
            FlowService(
                flow,
                self._reply,
                lambda m, now: core.predict_ttft(
                    RouteRequest(
                        request_id=m.ticket, model=m.model, token_ids=m.token_ids, dry_run=True
                    ),
                    now,
                ),
                clock,
                self.metrics.registry,
            )
            if flow is not None
            else None
        )

    @property
    def kv_listen_endpoint(self) -> str | None:
        """Where the KV listener's rank-0 SUB bound or connected (None: no listener)."""
        ingestor = self.ingestor
        listener = ingestor.listener if ingestor is not None else None
        return listener.endpoints[0] if listener is not None and listener.endpoints else None

    async def run(
        self,
        stop: asyncio.Event,
        *,
        ports: PortRange | None = None,
        on_bound: Callable[[str], None] | None = None,
    ) -> None:
        """Serve until `stop`; `on_bound(endpoint)` once the sockets are bound (a port 0 in
        `bind` searched in `ports`; the KV listener's too, see `kv_listen_endpoint`)."""
        raw = new_socket(self._ctx, zmq.ROUTER, bind=self.bind, sync=True, ports=ports)
        self.bind = bound_endpoint(raw)
        watch: asyncio.Task[None] | None = None
        try:
            if self.ingestor is not None:
                await self.ingestor.start(ports)
            if on_bound is not None:
                on_bound(self.bind)
            if not await self.fleet.start_unless_stopped(stop):
                return
            self.core.set_instances(self.fleet.instances)
            if self.ingestor is not None:
                self.ingestor.apply_events(
                    [InstanceAdded(i) for i in self.fleet.instances.values()]
                )
            if self.poller is not None:
                self.poller.apply(self.fleet.instances)
            log.info(
                "router ready bind=%s mode=%s instances=%d",
                self.bind,
                self.core.mode,
                len(self.fleet.instances),
            )
            for profile in (self.core.decode, self.core.prefill):
                log.info("routing profile %s", profile.describe())
            self._sock = LoopSocket(raw, self._on_message, multipart=True)
            watch = asyncio.get_running_loop().create_task(self._watch_silence(stop))
            await stop.wait()
        finally:
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            if self._sock is not None:
                self._sock.close()
            else:
                raw.close(linger=0)
            await self.fleet.close()
            if self.flow is not None:
                self.flow.close()
            if self.poller is not None:
                await self.poller.close()
            if self.ingestor is not None:
                await self.ingestor.close()
            self._ctx.term()

    async def _watch_silence(self, stop: asyncio.Event) -> None:
        if self.ingestor is None:
            return
        while not stop.is_set():
            await asyncio.sleep(_SILENCE_CHECK_S)
            now = self.clock()
            self.ingestor.check_silence(now)
            if self.stale_after > 0:
                self.ingestor.check_stale(now, self._running_requests, self.stale_after)

    def _running_requests(self, key: WorkerKey) -> int:
        """Requests running on a worker: the engine's fresh report, else routed and not
        finished (the router's own bookkeeping)."""
        core = self.core
        report = core.engine_loads.load(key)
        if core.engine_loads.fresh(report, self.clock()):
            return report.running
        return core.tracker.load(key).in_flight

    def _on_load(self, key: WorkerKey, load: common_pb2.EngineLoad) -> None:
        self.core.engine_loads.update(key, load, self.clock())
        if self.poller is not None:
            self.poller.pushed(key[0])

    def _on_fleet_change(self, events: list[InstanceEvent]) -> None:
        self.core.set_instances(self.fleet.instances)
        if self.ingestor is not None:
            self.ingestor.apply_events(events)
        if self.poller is not None:
            self.poller.apply(self.fleet.instances)

    def _on_message(self, frames: list[bytes]) -> None:
        """One message is one request, or a list of them (all a preprocessor had in one loop
        iteration): a list is answered by one list of its route responses, in order. The
        answer goes out before the decisions' metrics are recorded (`_account`): the asker
        waits on the answer, not on them."""
        routed = decode_routed(frames, codec.router_request, "router request")
        if routed is None:
            return
        identity, message = routed
        if type(message) is list:
            decided = [d for d in (self._handle(identity, m) for m in message) if d is not None]
            if decided:
                self._reply(identity, [d.response for d in decided])
                for d in decided:
                    self._account(d)
        else:
            one = self._handle(identity, message)
            if one is not None:
                self._reply(identity, one.response)
                self._account(one)
        if self._pending_debug:
            asked, self._pending_debug = self._pending_debug, []
            for request in asked:
                self._reply(identity, self._kv_debug(request))

    def _kv_debug(self, request: KvDebugRequest) -> KvDebugReply:
        body = kv_debug.describe(
            request.instance_id,
            request.dp_rank,
            self.ingestor,
            self.core.index,
            self.fleet.instances,
            self.clock(),
        )
        return KvDebugReply(request_id=request.request_id, found=body is not None, body=body or {})

    def _handle(self, identity: bytes, message: RouterRequest) -> _Decided | None:
        if type(message) is RouteRequest:  # the decoder makes exact types: the common first
            return self._route(message)
        if type(message) is RouteProgress:
            self.core.progress(message, self.clock())
            return None
        if isinstance(message, FlowAdmit | FlowRelease | FlowSync):
            if self.flow is not None:
                self.flow.handle(identity, message)
            elif isinstance(message, FlowAdmit):
                self._reply(identity, no_gate(message))
            return None
        if isinstance(message, FlowStatusRequest):
            status = self.flow.status(message) if self.flow is not None else None
            self._reply(identity, status or FlowStatus(request_id=message.request_id))
            return None
        if isinstance(message, KvDebugRequest):  # answered apart (a reply of its own)
            self._pending_debug.append(message)
        elif isinstance(message, InstanceBusy):
            self.core.mark_busy(message.instance_id, self.clock() + message.seconds)
        return None

    def _route(self, message: RouteRequest) -> _Decided:
        core = self.core
        started = time.perf_counter()
        now = self.clock()
        response = core.route(message, now).response
        if message.dry_run and response.workers and self.ingestor is not None:
            response = kv_debug.with_staleness(response, self.ingestor, core.index, now)
        return _Decided(message, response, now, time.perf_counter() - started)

    def _account(self, decided: _Decided) -> None:
        """A decision's metrics and the KV ingestor's note of it, after its answer went."""
        metrics = self.metrics
        metrics.latency.observe(decided.seconds)
        reply, message = decided.response, decided.request
        if reply.instance_id is None or message.dry_run:
            return
        metrics.decisions.inc_labels((self.core.mode, message.model))
        instance = self.fleet.instances.get(reply.instance_id)
        if instance is not None:
            metrics.routed.inc_labels((instance.model, instance.url))
        if reply.prompt_blocks:
            metrics.hit_ratio.observe(reply.overlap_blocks / reply.prompt_blocks)
        if reply.predicted_ttft_ms:
            metrics.predicted_ttft.observe(reply.predicted_ttft_ms / 1e3)
        if self.ingestor is not None:
            self.ingestor.note_routed(reply.instance_id, decided.now, reply.dp_rank or 0)

    def _reply(
        self,
        identity: bytes,
        reply: RouteResponse
        | KvDebugReply
        | FlowDecision
        | FlowStatus
        | list[RouteResponse]
        | list[FlowDecision],
    ) -> None:
        assert self._sock is not None
        try:
            self._sock.send_multipart([identity, codec.encode(reply)])
        except zmq.ZMQError as exc:  # the asker went away
            log.debug("route reply dropped: %s", exc)
