"""The dispatcher process: a ZMQ ROUTER taking GenerateRequest/CancelRequest from
preprocessors and streaming TokenDelta ... GenerateFinished (or GenerateFailed) back."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import zmq
import zmq.asyncio

from switchyard.common import errors
from switchyard.common.fleet_client import FleetClient
from switchyard.common.messaging import new_socket
from switchyard.dispatcher.channels import ChannelPool
from switchyard.dispatcher.metrics import DispatcherMetrics
from switchyard.dispatcher.streams import run_generation
from switchyard.protos import codec
from switchyard.protos.messages import (
    CancelRequest,
    GenerateFailed,
    GenerateRequest,
    InstanceAdded,
)

log = logging.getLogger(__name__)


class DispatcherService:
    def __init__(self, bind: str, fleet_control: str, fleet_events: str) -> None:
        self.bind = bind
        self.metrics = DispatcherMetrics()
        self.pool = ChannelPool()
        self.fleet = FleetClient(fleet_control, fleet_events, on_change=self.pool.apply)
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        # (peer identity, request id) -> its generation task
        self._tasks: dict[tuple[bytes, str], asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        self._sock = new_socket(self._ctx, zmq.ROUTER, bind=self.bind)
        await self.fleet.start()
        self.pool.apply(
            [
                InstanceAdded(i)
                for i in self.fleet.instances.values()
                if self.pool.get(i.instance_id) is None
            ]
        )
        log.info("dispatcher ready bind=%s instances=%d", self.bind, len(self.pool))
        serve = asyncio.create_task(self._serve(self._sock))
        try:
            await stop.wait()
        finally:
            serve.cancel()
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(serve, *tasks, return_exceptions=True)
            await self.fleet.close()
            await self.pool.close()
            self._sock.close(linger=0)
            self._ctx.term()

    async def _serve(self, sock: zmq.asyncio.Socket) -> None:
        decode = codec.dispatcher_request.decode
        while True:
            identity, payload = await sock.recv_multipart()
            peer = identity
            try:
                message = decode(payload)
            except msgspec.DecodeError:
                log.warning("undecodable dispatcher request")
                continue
            if isinstance(message, GenerateRequest):
                self._start(sock, peer, message)
            elif isinstance(message, CancelRequest):
                task = self._tasks.get((peer, message.request_id))
                if task is not None:
                    task.cancel()

    def _start(self, sock: zmq.asyncio.Socket, peer: bytes, request: GenerateRequest) -> None:
        key = (peer, request.request_id)
        encode = codec.encode

        async def send(reply: object) -> None:
            try:
                await sock.send_multipart([peer, encode(reply)])
            except zmq.ZMQError:  # the preprocessor went away: stop generating for it
                task = self._tasks.get(key)
                if task is not None:
                    task.cancel()

        client = self.pool.get(request.instance_id)
        if client is None:
            failed = GenerateFailed(
                request_id=request.request_id,
                instance_id=request.instance_id,
                kind=errors.CANNOT_CONNECT,
                message=f"instance {request.instance_id} is not known to this dispatcher",
            )
            self._spawn(send(failed))
            return
        metrics = self.metrics
        in_flight = metrics.in_flight.labels(str(request.instance_id))
        on_error = metrics.errors.labels
        task = asyncio.create_task(
            run_generation(
                client, request, send, self._report_down, lambda kind: on_error(kind).inc()
            )
        )
        self._tasks[key] = task
        metrics.generations.inc()
        in_flight.inc()

        def done(_task: asyncio.Task[None]) -> None:
            self._tasks.pop(key, None)
            in_flight.dec()

        task.add_done_callback(done)

    def _report_down(self, instance_id: int, kind: str, detail: str) -> None:
        self._spawn(self.fleet.report_down(instance_id, kind, detail))

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
