"""ZMQ helpers shared by the services: sockets with sane options, and a DEALER client that
matches replies to callers by request id (one socket serves many concurrent requests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from switchyard.protos.codec import encode

log = logging.getLogger(__name__)


def new_socket(
    ctx: zmq.asyncio.Context,
    kind: int,
    *,
    bind: str | None = None,
    connect: list[str] | tuple[str, ...] = (),
) -> zmq.asyncio.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    # Unbounded queues: a slow peer must not silently drop per-token messages.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if kind == zmq.ROUTER:
        # Fail loudly instead of dropping a reply to a peer that went away.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if bind:
        sock.bind(bind)
    for endpoint in connect:
        sock.connect(endpoint)
    return sock


class DealerClient:
    """A DEALER connected to one service endpoint. `handle(reply)` is called for every reply
    by the reader task; subclasses route replies to their waiters by request id.

    `connected` follows the peer through the socket's monitor: False until the handshake
    with the service succeeds, and again as soon as the connection drops (the service died
    or restarts; ZMQ reconnects by itself). `on_disconnect()` is called on every drop.
    """

    def __init__(
        self,
        endpoint: str,
        decoder: msgspec.msgpack.Decoder,
        ctx: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._ctx = ctx or zmq.asyncio.Context.instance()
        self._sock = new_socket(self._ctx, zmq.DEALER)
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
        )
        self._sock.connect(endpoint)
        self._decoder = decoder
        self._reader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.connected = False
        self._connected = asyncio.Event()

    def start(self) -> None:
        if self._reader is None:
            self._reader = asyncio.create_task(self._read_loop(), name=f"dealer:{self.endpoint}")
            self._watcher = asyncio.create_task(self._watch(), name=f"monitor:{self.endpoint}")

    async def wait_connected(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        except TimeoutError:
            return False
        return True

    async def send(self, message: Any) -> None:
        await self._sock.send(encode(message))

    def handle(self, reply: Any) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def on_disconnect(self) -> None:
        """Called when the connection to the service drops (override to fail waiters)."""

    async def _watch(self) -> None:
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = True
                self._connected.set()
                log.info("connected to %s", self.endpoint)
            elif event == zmq.EVENT_DISCONNECTED and self.connected:
                self.connected = False
                self._connected.clear()
                log.warning("lost connection to %s", self.endpoint)
                self.on_disconnect()

    async def _read_loop(self) -> None:
        decode = self._decoder.decode
        recv = self._sock.recv
        while True:
            frame = await recv()  # copying small messages beats zero-copy Frames
            try:
                reply = decode(frame)
            except msgspec.DecodeError:
                log.warning("undecodable reply from %s", self.endpoint)
                continue
            self.handle(reply)

    async def close(self) -> None:
        for task in (self._reader, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._reader = self._watcher = None
        self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close(linger=0)


class RequestReplyClient(DealerClient):
    """One reply per request, matched by `key(reply)`."""

    def __init__(
        self,
        endpoint: str,
        decoder: msgspec.msgpack.Decoder,
        key: Callable[[Any], str],
        ctx: zmq.asyncio.Context | None = None,
    ) -> None:
        super().__init__(endpoint, decoder, ctx)
        self._key = key
        self._waiters: dict[str, asyncio.Future[Any]] = {}

    async def call(self, request_id: str, message: Any, timeout: float) -> Any:
        """Send and wait for the reply; raises TimeoutError when none comes in time."""
        self.start()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = future
        try:
            await self.send(message)
            async with asyncio.timeout(timeout):
                return await future
        finally:
            self._waiters.pop(request_id, None)

    def handle(self, reply: Any) -> None:
        future = self._waiters.pop(self._key(reply), None)
        if future is not None and not future.done():
            future.set_result(reply)
