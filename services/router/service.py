"""The router process: follows fleet, ingests the engines' KV events, answers RouteRequest on
a ZMQ ROUTER socket, inline in the socket's read callback (no task or queue per request)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from switchyard.common.engines.connect import client_for
from switchyard.common.engines.tls import EngineTls
from switchyard.common.fleet_client import FleetClient
from switchyard.common.messaging import LoopSocket, bound_endpoint, decode_routed, new_socket
from switchyard.common.ports import PortRange
from switchyard.protos import codec
from switchyard.protos.messages import (
    InstanceAdded,
    InstanceBusy,
    InstanceEvent,
    RouteProgress,
    RouteRequest,
    RouteResponse,
    RouterRequest,
)
from switchyard.router.core import RouterCore
from switchyard.router.kv.ingestor import KvIngestor
from switchyard.router.metrics import RouterMetrics

log = logging.getLogger(__name__)


class RouterService:
    def __init__(
        self,
        core: RouterCore,
        bind: str,
        fleet_control: str,
        fleet_events: str,
        metrics: RouterMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        tls: EngineTls | None = None,
    ) -> None:
        self.core = core
        self.bind = bind
        self.metrics = metrics or RouterMetrics(core.index)
        self.clock = clock
        self._ctx = zmq.asyncio.Context()
        # Only KV-aware routing needs the engines' events.
        self.ingestor = (
            KvIngestor(
                core.index,
                context=self._ctx,
                open_client=lambda i: client_for(i.protocol, i.url, i.instance_id, tls),
            )
            if core.policy.needs_overlap
            else None
        )
        self.fleet = FleetClient(fleet_control, fleet_events, on_change=self._on_fleet_change)
        self._sock: LoopSocket | None = None

    async def run(
        self,
        stop: asyncio.Event,
        *,
        ports: PortRange | None = None,
        on_bound: Callable[[str], None] | None = None,
    ) -> None:
        """Serve until `stop`; `on_bound(endpoint)` once the socket is bound (a port 0 in
        `bind` searched in `ports`)."""
        raw = new_socket(self._ctx, zmq.ROUTER, bind=self.bind, sync=True, ports=ports)
        self.bind = bound_endpoint(raw)
        if on_bound is not None:
            on_bound(self.bind)
        await self.fleet.start()
        self.core.set_instances(self.fleet.instances)
        if self.ingestor is not None:
            self.ingestor.apply_events([InstanceAdded(i) for i in self.fleet.instances.values()])
        log.info(
            "router ready bind=%s policy=%s instances=%d",
            self.bind,
            self.core.policy.name,
            len(self.fleet.instances),
        )
        self._sock = sock = LoopSocket(raw, self._on_message, multipart=True)
        try:
            await stop.wait()
        finally:
            sock.close()
            await self.fleet.close()
            if self.ingestor is not None:
                await self.ingestor.close()
            self._ctx.term()

    def _on_fleet_change(self, events: list[InstanceEvent]) -> None:
        self.core.set_instances(self.fleet.instances)
        if self.ingestor is not None:
            self.ingestor.apply_events(events)

    def _on_message(self, frames: list[bytes]) -> None:
        """One message is one request, or a list of them (all a preprocessor had in one loop
        iteration): a list is answered by one list of its route responses, in order."""
        routed = decode_routed(frames, codec.router_request, "router request")
        if routed is None:
            return
        identity, message = routed
        if type(message) is list:
            replies = [r for r in map(self._handle, message) if r is not None]
            if replies:
                self._reply(identity, replies)
        else:
            reply = self._handle(message)
            if reply is not None:
                self._reply(identity, reply)

    def _handle(self, message: RouterRequest) -> RouteResponse | None:
        core = self.core
        if isinstance(message, RouteRequest):
            metrics = self.metrics
            started = time.perf_counter()
            routed = core.route(message, self.clock())
            metrics.latency.observe(time.perf_counter() - started)
            reply = routed.response
            if reply.instance_id is not None and not message.dry_run:
                metrics.decisions.labels(core.policy.name).inc()
                if reply.prompt_blocks:
                    metrics.hit_ratio.observe(reply.overlap_blocks / reply.prompt_blocks)
            return reply
        if isinstance(message, RouteProgress):
            core.progress(message)
        elif isinstance(message, InstanceBusy):
            core.mark_busy(message.instance_id, self.clock() + message.seconds)
        return None

    def _reply(self, identity: bytes, reply: RouteResponse | list[RouteResponse]) -> None:
        assert self._sock is not None
        try:
            self._sock.send_multipart([identity, codec.encode(reply)])
        except zmq.ZMQError as exc:  # the asker went away
            log.debug("route reply dropped: %s", exc)
