"""The router process: follows fleet, answers RouteRequest on a ZMQ ROUTER socket."""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
import zmq
import zmq.asyncio

from switchyard.common.fleet_client import FleetClient
from switchyard.common.messaging import new_socket
from switchyard.protos import codec
from switchyard.protos.messages import RouteProgress, RouteRequest
from switchyard.router.core import RouterCore

log = logging.getLogger(__name__)


class RouterService:
    def __init__(
        self,
        core: RouterCore,
        bind: str,
        fleet_control: str,
        fleet_events: str,
        clock=time.monotonic,
    ) -> None:
        self.core = core
        self.bind = bind
        self.fleet = FleetClient(fleet_control, fleet_events, on_change=self._on_fleet_change)
        self.clock = clock
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None

    async def run(self, stop: asyncio.Event) -> None:
        self._sock = new_socket(self._ctx, zmq.ROUTER, bind=self.bind)
        await self.fleet.start()
        self.core.set_instances(self.fleet.instances)
        log.info(
            "router ready bind=%s policy=%s instances=%d",
            self.bind,
            self.core.policy.name,
            len(self.fleet.instances),
        )
        serve = asyncio.create_task(self._serve(self._sock))
        try:
            await stop.wait()
        finally:
            serve.cancel()
            await asyncio.gather(serve, return_exceptions=True)
            await self.fleet.close()
            self._sock.close(linger=0)
            self._ctx.term()

    def _on_fleet_change(self, events) -> None:
        self.core.set_instances(self.fleet.instances)

    async def _serve(self, sock: zmq.asyncio.Socket) -> None:
        decode = codec.router_request.decode
        encode = codec.encode
        core = self.core
        while True:
            identity, payload = await sock.recv_multipart(copy=False)
            try:
                message = decode(payload.buffer)
            except msgspec.DecodeError:
                log.warning("undecodable router request")
                continue
            if isinstance(message, RouteRequest):
                reply = core.route(message, self.clock())
                try:
                    await sock.send_multipart([identity, encode(reply)])
                except zmq.ZMQError as exc:  # the asker went away
                    log.debug("route reply dropped: %s", exc)
            elif isinstance(message, RouteProgress):
                core.progress(message)
