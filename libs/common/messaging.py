"""ZMQ helpers shared by the services: sockets with sane options, and a DEALER client that
matches replies to callers by request id (one socket serves many concurrent requests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from switchyard.common.native import load
from switchyard.common.ports import PortRange, zmq_bind
from switchyard.protos.codec import encode

log = logging.getLogger(__name__)


def new_socket(
    ctx: zmq.Context[Any],
    kind: int,
    *,
    bind: str | None = None,
    connect: list[str] | tuple[str, ...] = (),
    sync: bool = False,
    ports: PortRange | None = None,
) -> Any:
    """A socket with the options every service wants; `sync=True` gives a plain (blocking API)
    socket even from an asyncio context, for `LoopSocket`. A `bind` endpoint with port 0
    binds a free port of `ports` (see common.ports; `bound_endpoint(sock)` tells which)."""
    sock = zmq.Socket(ctx, kind) if sync else ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    # Unbounded queues: a slow peer must not silently drop per-token messages.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if kind == zmq.ROUTER:
        # Fail loudly instead of dropping a reply to a peer that went away.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if bind:
        try:
            zmq_bind(sock, bind, ports)
        except BaseException:
            sock.close(linger=0)
            raise
    for endpoint in connect:
        sock.connect(endpoint)
    return sock


def bound_endpoint(sock: Any) -> str:
    """The endpoint a socket bound last (its port resolved)."""
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else str(last)


def decode_routed(
    frames: list[bytes], decoder: msgspec.msgpack.Decoder, what: str
) -> tuple[bytes, Any] | None:
    """A ROUTER's incoming message, [peer identity, payload]: (identity, decoded payload), or
    None (logged) for a malformed one."""
    if len(frames) != 2:
        log.warning("malformed %s (%d frames)", what, len(frames))
        return None
    identity, payload = frames
    try:
        return identity, decoder.decode(payload)
    except msgspec.DecodeError:
        log.warning("undecodable %s", what)
        return None


# pyzmq's Cython socket, under its Python layer (zmq.Socket): for plain bytes frames with copy
# on, its calls do the same as the Python ones (send_multipart, recv_multipart, the EVENTS
# attribute) for less CPU per message (docs/benchmarks.md, "ZMQ between processes").
_get = zmq.backend.Socket.get
_recv = zmq.backend.Socket.recv
_send = zmq.backend.Socket.send
# Plain ints, not pyzmq's enums: `events & zmq.POLLIN` builds a PollEvent through the enum
# machinery on every call (a few microseconds per drained message, in the router's profile).
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


def py_events(sock: zmq.Socket[Any]) -> int:
    """The socket's ZMQ_EVENTS (the Python form of the C extension's `events`)."""
    return _get(sock, _EVENTS)  # type: ignore[arg-type,return-value]


def _native_events() -> Callable[[zmq.Socket[Any]], int] | None:
    """The C extension's `events` (libs/common/_zmqevents.c), bound to pyzmq's libzmq: the
    same int as `py_events` without pyzmq's SocketOption lookup per call (two enum calls)."""
    native = load("switchyard.common._zmqevents")
    backend = getattr(sys.modules.get(zmq.backend.Socket.__module__), "__file__", None)
    if native is None or backend is None:
        return None
    try:
        native.init(backend, py_events)
    except OSError as exc:  # a pyzmq not built as a shared module: the Python form
        log.debug("ZMQ_EVENTS read through pyzmq: %s", exc)
        return None
    events: Callable[[zmq.Socket[Any]], int] = native.events
    return events


events = _native_events() or py_events


def recv_multipart_now(sock: zmq.Socket[Any]) -> list[bytes]:
    """Every frame of the next message, without waiting (raises zmq.Again when none).

    Received as zmq.Frame (copy off) for its `more` flag: asking the socket for RCVMORE goes
    through pyzmq's option lookup, a third more per two-frame message (docs/benchmarks.md,
    "The router's request path")."""
    frame = _recv(sock, _NOBLOCK, False)
    frames = [frame.bytes]
    while frame.more:
        frame = _recv(sock, _NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


def send_multipart_now(sock: zmq.Socket[Any], frames: list[bytes]) -> None:
    """Queue a message without waiting. ZMQ takes a multipart message whole or not at all, so
    zmq.Again can only come from the first frame."""
    last = len(frames) - 1
    for index, frame in enumerate(frames):
        _send(sock, frame, _MORE if index < last else _NOBLOCK)


class LoopSocket:
    """A ZMQ socket driven straight from the event loop, for the per-token paths.

    zmq.asyncio makes a future and runs several Python layers per message; in the profiles that
    was the largest per-token cost of the dispatcher and the preprocessor. Here the socket's FD
    is watched with `loop.add_reader` and every message that is ready is taken at once with
    non-blocking recv (pyzmq's Cython calls, see above) and handed to `on_message`
    (synchronously); sends are non-blocking calls.

    ZMQ's FD is edge-triggered and a send may consume the wake-up of a message that arrived in
    the meantime, so after each send the socket's events are read, and a message found waiting
    is drained on the next loop iteration. Each `ZMQ_EVENTS` read costs libzmq a `getpid` and
    a `poll`, so a drain reads them only between messages (a wake-up's first message is just
    received; a spurious wake-up meets zmq.Again), and a send from `on_message` during a
    drain leaves the check to the drain's own next read.
    With unbounded HWMs a send never waits (`zmq.Again` is retried from a timer all the same);
    a ROUTER_MANDATORY send to a peer that is gone raises ZMQError to the caller.
    """

    def __init__(
        self,
        sock: zmq.Socket[Any],
        on_message: Callable[[Any], None],
        *,
        multipart: bool,
    ) -> None:
        self.sock = sock
        self._on_message = on_message
        self._multipart = multipart
        self._loop = asyncio.get_running_loop()
        self._drain_soon = False
        self._draining = False  # in _drain: its next ZMQ_EVENTS read covers what sends miss
        self._backlog: list[tuple[bool, Any]] = []  # sends that met zmq.Again, in order
        self._closed = False
        self._loop.add_reader(sock.FD, self._drain)
        self._loop.call_soon(self._drain)  # messages that came before the reader was added

    def _drain(self) -> None:
        # Every way out but closing passes a ZMQ_EVENTS read or a failed recv, both of which
        # process libzmq's pending commands: the FD is re-armed for the next message.
        self._drain_soon = False
        sock, handle, multipart = self.sock, self._on_message, self._multipart
        read_events = events
        self._draining = True
        try:
            while not self._closed:
                try:
                    message = recv_multipart_now(sock) if multipart else _recv(sock, _NOBLOCK)
                except zmq.Again:
                    break
                try:
                    handle(message)
                except Exception:  # one bad message must not stop the socket
                    log.exception("message handler failed")
                if self._closed or not read_events(sock) & _POLLIN:
                    break
        finally:
            self._draining = False

    def _sent(self) -> None:
        # Asked here rather than on the next iteration: a drain scheduled after every send
        # cost the loop one more iteration per send, a poll that almost always finds nothing.
        if self._draining or self._drain_soon or self._closed:
            return
        if events(self.sock) & _POLLIN:
            self._drain_soon = True
            self._loop.call_soon(self._drain)

    def send(self, data: bytes) -> None:
        self._send(False, data)

    def send_multipart(self, frames: list[bytes]) -> None:
        self._send(True, frames)

    def _send(self, multipart: bool, data: Any) -> None:
        if self._closed:
            raise zmq.ZMQError(zmq.ENOTSOCK, "socket closed")
        if self._backlog:
            self._backlog.append((multipart, data))
            return
        try:
            self._send_now(multipart, data)
        except zmq.Again:
            self._backlog.append((multipart, data))
            self._loop.call_later(0.001, self._retry)
        self._sent()

    def _send_now(self, multipart: bool, data: Any) -> None:
        if multipart:
            send_multipart_now(self.sock, data)
        else:
            _send(self.sock, data, _NOBLOCK)

    def _retry(self) -> None:
        while self._backlog and not self._closed:
            multipart, data = self._backlog[0]
            try:
                self._send_now(multipart, data)
            except zmq.Again:
                self._loop.call_later(0.001, self._retry)
                break
            except zmq.ZMQError as exc:
                log.warning("dropped a queued message: %s", exc)
            self._backlog.pop(0)
        self._sent()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self.sock.FD)
            self.sock.close(linger=0)


class DealerClient:
    """A DEALER connected to one service endpoint. `handle(reply)` is called for every reply
    by the reader task; subclasses route replies to their waiters by request id.

    Sends are batched per loop iteration: what the client has for the service in one
    iteration (the requests of HTTP requests that reached the same stage together, the
    notices of streams whose tokens came in one message) goes out on the next one as one
    message, a list, which the service decodes as well as a single message: one send, one
    wake-up and one read on each side instead of one per message (bench/hops.py route). A
    lone message goes as itself. The first message of an iteration whose type is in `urgent`
    (a request the caller then waits on) goes at once, with what was queued before it, in
    order: holding it back to the next iteration made it wait for everything else the loop
    had to do first (other requests' stages, the token batches read meanwhile), under load
    most of its wait for the answer.

    `connected` follows the peer through the socket's monitor: False until the handshake
    with the service succeeds, and again as soon as the connection drops (the service died
    or restarts; ZMQ reconnects by itself). `on_disconnect()` is called on every drop, then
    `on_state()` (when set: a replicas.ReplicaSet's hook) on every change. A closed client
    stays closed: it is not connected and sends nothing.

    With `heartbeat` (seconds), libzmq pings the service four times per `heartbeat` and drops
    the connection when nothing came back for `heartbeat` seconds: a frozen service (SIGSTOP,
    a hung host) keeps its TCP connection open, so only this tells. Its pongs come from its
    ZMQ I/O thread, which a busy event loop does not hold up.
    """

    def __init__(
        self,
        endpoint: str,
        decoder: msgspec.msgpack.Decoder,
        ctx: zmq.asyncio.Context | None = None,
        urgent: tuple[type, ...] = (),
        heartbeat: float | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._ctx = ctx or zmq.asyncio.Context.instance()
        self._sock: zmq.Socket[Any] = new_socket(self._ctx, zmq.DEALER, sync=True)
        if heartbeat:
            self._sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, round(heartbeat * 250)))
            self._sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, round(heartbeat * 1000)))
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
        )
        self._sock.connect(endpoint)
        self._decoder = decoder
        self._io: LoopSocket | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.connected = False
        self._connected = asyncio.Event()
        self.on_state: Callable[[], None] | None = None
        self._closed = False
        self._urgent = urgent
        self._queued: list[Any] = []
        self._tick_pending = False  # a _tick is scheduled (on the next loop iteration)
        self._sent_now = False  # an urgent message went at once since the last _tick

    def start(self) -> None:
        if self._io is None and not self._closed:
            self._io = LoopSocket(self._sock, self._on_frame, multipart=False)
            self._watcher = asyncio.create_task(self._watch(), name=f"monitor:{self.endpoint}")

    async def wait_connected(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        except TimeoutError:
            return False
        return True

    async def send(self, message: Any) -> None:
        self.send_now(message)

    def send_now(self, message: Any) -> None:
        """Queue `message` for the service without waiting. Raises zmq.ZMQError when an
        urgent message cannot be sent (the client is closing)."""
        self._queued.append(message)
        if not self._sent_now and type(message) in self._urgent:
            self._sent_now = True
            self._flush()
        if not self._tick_pending:
            self._tick_pending = True
            asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self._tick_pending = False
        self._sent_now = False
        if self._queued:
            try:
                self._flush()
            except zmq.ZMQError as exc:  # closing: the callers time out or are failed
                log.warning("messages to %s not sent: %s", self.endpoint, exc)

    def _flush(self) -> None:
        queued, self._queued = self._queued, []
        if self._io is None:
            self.start()
        if self._io is None:
            raise zmq.ZMQError(zmq.ENOTSOCK, f"the client of {self.endpoint} is closed")
        self._io.send(encode(queued[0] if len(queued) == 1 else queued))

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
            else:
                continue
            if self.on_state is not None:
                self.on_state()

    def _on_frame(self, frame: bytes) -> None:
        try:
            reply = self._decoder.decode(frame)
        except msgspec.DecodeError:
            log.warning("undecodable reply from %s", self.endpoint)
            return
        self.handle(reply)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.connected = False
        self._connected.clear()
        self._queued = []  # like the socket's LINGER 0: unsent messages are dropped
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        self._watcher = None
        self._sock.disable_monitor()
        self._monitor.close(linger=0)
        if self._io is not None:
            self._io.close()
            self._io = None
        else:
            self._sock.close(linger=0)


class ConnectionLost(ConnectionError):
    """The connection to the service dropped while the call waited for its reply."""


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class RequestReplyClient(DealerClient):
    """One reply per request, matched by `key(reply)`. Calls waiting when the connection
    drops fail at once with ConnectionLost (the service died: its answer will never come)."""

    def __init__(
        self,
        endpoint: str,
        decoder: msgspec.msgpack.Decoder,
        key: Callable[[Any], str],
        ctx: zmq.asyncio.Context | None = None,
        urgent: tuple[type, ...] = (),
    ) -> None:
        super().__init__(endpoint, decoder, ctx, urgent)
        self._key = key
        self._waiters: dict[str, asyncio.Future[Any]] = {}

    async def call(self, request_id: str, message: Any, timeout: float) -> Any:
        """Send and wait for the reply; raises TimeoutError when none comes in time and
        ConnectionLost when the connection drops meanwhile."""
        self.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._waiters[request_id] = future
        # The deadline fails the future itself: one timer handle, where asyncio.timeout's
        # context manager also cancels and uncancels the task around it.
        deadline = loop.call_later(timeout, _expire, future)
        try:
            self.send_now(message)
            return await future
        finally:
            deadline.cancel()
            self._waiters.pop(request_id, None)

    def pending(self) -> int:
        """Calls waiting for their reply."""
        return len(self._waiters)

    def handle(self, reply: Any) -> None:
        future = self._waiters.pop(self._key(reply), None)
        if future is not None and not future.done():
            future.set_result(reply)

    def on_disconnect(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for future in waiters.values():
            if not future.done():
                future.set_exception(ConnectionLost(f"lost connection to {self.endpoint}"))
