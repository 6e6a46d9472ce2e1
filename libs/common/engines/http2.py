"""gRPC calls over HTTP/2 on the event loop's own socket: Generate streams, and unary calls
as streams of one reply.

grpc.aio hands every message of a stream from gRPC core's poller thread to the loop and
through several Python layers; at the dispatcher's rate (a message per token per stream) that
is its largest cost. This client speaks the same wire, gRPC over HTTP/2 (RFC 9113, and
gRPC's PROTOCOL-HTTP2), on an asyncio Protocol: one wake-up per read, every frame of the read
parsed in one pass, each message decoded straight into the family's protobuf
(docs/benchmarks.md, "Engine connections"). EngineClient sends Generate and its
HealthCheck, GetModelInfo, GetServerInfo and GetLoads calls this way; Abort, Embed and
GetTokenizer stay on the grpc.aio channel.

What it does of HTTP/2:
- one connection per engine, opened by the first call, shared by every stream; a connection
  that is lost or told to go away (GOAWAY) is replaced by the next call;
- flow control: receive windows opened wide and topped up as data is consumed; a request larger
  than the engine's window goes out frame by frame as its WINDOW_UPDATEs come;
- the peer's SETTINGS (initial window, frame size, concurrent streams: calls past the limit
  wait for a slot), PING answered, CONTINUATION and padding read;
- keepalive as the grpc.aio channel's (base.KEEPALIVE_*): while streams are open a PING every
  12 s, and a connection whose ack takes over 4 s is closed, its streams failed UNAVAILABLE.
Failures are EngineErrors of the same kinds as grpc.aio's (errors.kind_of_status): the
stream's grpc-status, an HTTP status or RST_STREAM code mapped as gRPC does, a lost or refused
connection UNAVAILABLE (cannot_connect), the client closed under a call `disconnected`.
An UNAVAILABLE the engine answers while its connection still takes new streams (a
grpc-status 14, HTTP 503, RST_STREAM REFUSED_STREAM; no GOAWAY yet) refuses that one call
(kind refused: migrate, the instance stays up); a connection this client could not open or
lost (refused, reset, GOAWAY, keepalive timeout) is cannot_connect. A server that stops
sends GOAWAY before it fails its calls UNAVAILABLE ("Cancelling all calls"): those are
cannot_connect. HTTP 429 is RESOURCE_EXHAUSTED (overloaded).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast
from urllib.parse import unquote

import grpc
import hpack

from switchyard.common import errors
from switchyard.common.engines import frames
from switchyard.common.errors import EngineError

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_KNOWN_BLOCKS = 64  # header blocks kept decoded per connection (Http2Connection)

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = 0x1  # DATA, HEADERS
ACK = 0x1  # SETTINGS, PING
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
# Receive windows are topped up once this much of them is consumed (one WINDOW_UPDATE per
# 1 GiB of stream data, not one per message).
REFILL = 2**30
# grpc.aio's client limit (base.CHANNEL_OPTIONS grpc.max_receive_message_length).
MAX_MESSAGE = 64 * 1024 * 1024
# gRPC core's minimum connect timeout: a host that does not answer fails the call after it.
CONNECT_TIMEOUT = 20.0

_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_STATUS = {code.value[0]: code for code in grpc.StatusCode}
# RST_STREAM error codes as gRPC maps them to statuses (PROTOCOL-HTTP2, "Errors").
# The engine's answer: an UNAVAILABLE here is `refused` while the connection is usable.
_RST_STATUS = {
    0x7: grpc.StatusCode.UNAVAILABLE,  # REFUSED_STREAM: the engine never saw it
    0x8: grpc.StatusCode.CANCELLED,
    0xB: grpc.StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
    0xC: grpc.StatusCode.PERMISSION_DENIED,  # INADEQUATE_SECURITY
}
# A non-200 HTTP status as gRPC maps it (the engine, or a proxy before it, refused the call),
# but 429: gRPC says UNAVAILABLE, and "too many requests" is an overload (mark busy, try
# another), not a refusal. 503 is the server refusing this call (`refused`); 502 and 504 are
# a proxy that could not reach the engine behind it (cannot_connect: instance down).
_HTTP_STATUS = {
    400: grpc.StatusCode.INTERNAL,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}
_HTTP_REFUSALS = frozenset({"503"})  # an UNAVAILABLE that is `refused`, not cannot_connect


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return (
        bytes((size >> 16 & 0xFF, size >> 8 & 0xFF, size & 0xFF, kind, flags))
        + _U32.pack(stream_id)
        + payload
    )


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_headers(headers: list[tuple[str, str]]) -> bytes:
    """An HPACK block of literals without indexing: the engine's dynamic table is never
    touched, so its HEADER_TABLE_SIZE does not matter."""
    out = bytearray()
    for name, value in headers:
        raw_name, raw_value = name.encode(), value.encode()
        out += b"\x00" + _hpack_int(len(raw_name), 7) + raw_name
        out += _hpack_int(len(raw_value), 7) + raw_value
    return bytes(out)


def closed_error(instance_id: int | None = None) -> EngineError:
    """A call on (or under) a client that was closed: kind disconnected, as grpc.aio's."""
    return EngineError(errors.DISCONNECTED, "the channel to the engine was closed", instance_id)


def status_error(
    code: grpc.StatusCode, details: str, instance_id: int | None = None, connected: bool = False
) -> EngineError:
    """An EngineError as grpc.aio's AioRpcError of that status becomes one; `connected`: the
    engine answered it on a live connection (errors.kind_of_status)."""
    message = f"{code.name}: {details}".rstrip(": ")
    return EngineError(errors.kind_of_status(code, connected), message, instance_id, code)


class Relay:
    """Where a stream's plain token chunks go, written by the connection's frame reader
    (frames.py) without a Python object per token: `sink`, a frames.ReplyBatch; `on_read(n)`
    after each read of the connection that wrote n of them (for any of its relayed streams);
    `on_first()` once this stream's first one was written (None: not asked)."""

    __slots__ = ("sink", "on_read", "on_first")

    def __init__(
        self,
        sink: Any,
        on_read: Callable[[int], None],
        on_first: Callable[[], None] | None = None,
    ) -> None:
        self.sink = sink
        self.on_read = on_read
        self.on_first = on_first


class StreamCall:
    """One server-streaming call: iterate it for the decoded replies; `cancel()` resets it.
    The request goes out at the first iteration (after the connection, when it must open).

    Or, the per-token way, `feed(on_items)` then `await until_done()`: `on_items(call)` is
    called in the connection's read callback each time replies arrive, takes them from
    `call.items` and calls `stop_reading()` once it has all it wants; no task wakes up per
    message, only `until_done` at the end (or at the call's failure, which it raises).
    With `relay_to(...)` as well, plain token chunks skip even that: the frame reader writes
    them into the relay's batch, and `on_items` sees the rest (the final message; any reply
    that is not a plain chunk), with `take_relayed()` the count of token ids it wrote."""

    __slots__ = (
        "_streams",
        "_request",
        "_decode",
        "stream_id",
        "conn",
        "items",
        "_waiter",
        "_buffer",
        "error",
        "ended",
        "cancelled",
        "send_window",
        "unsent",
        "received",
        "_on_items",
        "_stopped",
        "relay",
        "relay_id",
        "relay_layout",
        "relayed",
    )

    def __init__(
        self, streams: Http2Streams, request: tuple[bytes, bytes], decode: Callable[[bytes], Any]
    ) -> None:
        self._streams = streams
        self._request = request  # (header block, gRPC message bytes)
        self._decode = decode
        self.stream_id = 0  # 0: not started
        self.conn: Http2Connection | None = None
        self.items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._buffer = b""  # a message split across DATA frames
        self.error: EngineError | None = None
        self.ended = False
        self.cancelled = False
        self.send_window = 0
        self.unsent = b""  # request bytes waiting for flow-control window
        self.received = 0  # stream data consumed since its last WINDOW_UPDATE
        self._on_items: Callable[[StreamCall], None] | None = None
        self._stopped = False  # the feed's consumer has every reply it wants
        self.relay: Relay | None = None
        self.relay_id = ""
        self.relay_layout = 0
        self.relayed = 0  # token ids the frame reader relayed and take_relayed did not count

    def feed(self, on_items: Callable[[StreamCall], None]) -> None:
        self._on_items = on_items

    def relay_to(self, relay: Relay, request_id: str, layout: int) -> None:
        """Plain chunks of the stream go to `relay` as TokenDeltas of `request_id` (`layout`:
        frames.SGLANG or frames.VLLM); call before the call starts, with `feed`."""
        self.relay = relay
        self.relay_id = request_id
        self.relay_layout = layout

    def take_relayed(self) -> int:
        """Token ids relayed since the last call."""
        count, self.relayed = self.relayed, 0
        return count

    def first_relayed(self) -> None:
        relay = self.relay
        if relay is not None and relay.on_first is not None:
            relay.on_first()

    def handed_back(self, data: bytes, received: int, tokens: int) -> None:
        """The frame reader stopped relaying: `data` is the stream's undelivered bytes."""
        self.received += received
        self.relayed += tokens
        if data:
            self.data(data)

    def stop_reading(self) -> None:
        self._stopped = True
        self._wake()

    async def until_done(self) -> None:
        """Until the feed's consumer stopped reading, or the stream ended (raising its
        failure). Replies go to the feed, so none wait in `items` here."""
        while not self._stopped and await self._turn():
            pass

    def __aiter__(self) -> StreamCall:
        return self

    async def __anext__(self) -> Any:
        items = self.items
        while not items:
            if not await self._turn():
                raise StopAsyncIteration
        return items.popleft()

    async def _turn(self) -> bool:
        """Start the call, or wait for news of it; False once it is over (raises its
        failure)."""
        if self.error is not None:
            raise self.error
        if self.ended:
            return False
        if not self.stream_id:
            if self.cancelled:
                return False
            await self._streams.start(self, self._request)
            self._request = (b"", b"")
            return True
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        await waiter
        return True

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def data(self, payload: bytes) -> None:
        """A DATA frame's payload: every gRPC message it completes, decoded, is queued."""
        buf = self._buffer + payload if self._buffer else payload
        pos, size = 0, len(buf)
        items, decode = self.items, self._decode
        while size - pos >= 5:
            length = int.from_bytes(buf[pos + 1 : pos + 5], "big")
            end = pos + 5 + length
            if buf[pos]:
                self.fail(status_error(grpc.StatusCode.INTERNAL, "compressed message"), True)
                return
            if length > MAX_MESSAGE:
                why = f"a message of {length} bytes is over the limit of {MAX_MESSAGE}"
                self.fail(status_error(grpc.StatusCode.RESOURCE_EXHAUSTED, why), True)
                return
            if end > size:
                break
            try:
                items.append(decode(buf[pos + 5 : end]))
            except Exception as exc:  # a reply that is no message of the family's proto
                why = f"cannot parse the engine's reply: {exc}"
                self.fail(status_error(grpc.StatusCode.INTERNAL, why), True)
                return
            pos = end
        self._buffer = buf[pos:] if pos < size else b""
        on_items = self._on_items
        if on_items is None:
            self._wake()
        elif self._stopped:
            items.clear()  # past what the consumer wanted (nothing, from a sound engine)
        elif items:
            try:
                on_items(self)
            except EngineError as exc:  # the consumer refused a reply: the call fails
                self.fail(exc, True)
            except Exception as exc:  # whatever it is, the awaiting task gets it
                log.exception("a stream's reply consumer failed")
                why = f"{type(exc).__name__}: {exc}"
                self.fail(status_error(grpc.StatusCode.INTERNAL, why), True)

    def headers(self, block: Sequence[tuple[str, str]], end_stream: bool) -> None:
        """Response headers, trailers, or both at once (a trailers-only answer)."""
        status = None
        grpc_status = None
        message = ""
        for name, value in block:
            if name == ":status":
                status = value
            elif name == "grpc-status":
                grpc_status = value
            elif name == "grpc-message":
                message = unquote(value)
        if status is not None and status != "200" and grpc_status is None:
            code = _HTTP_STATUS.get(int(status) if status.isdigit() else 0)
            why = f"HTTP status {status}"
            refused = status in _HTTP_REFUSALS and self._live()
            self.fail(status_error(code or grpc.StatusCode.UNKNOWN, why, connected=refused), True)
            return
        if not end_stream:
            return
        self.finish()
        instance_id = self._streams.instance_id
        if grpc_status is None:
            why = "the engine ended the stream without a grpc-status"
            self.error = status_error(grpc.StatusCode.INTERNAL, why, instance_id)
        elif grpc_status != "0":
            code = _STATUS.get(int(grpc_status) if grpc_status.isdigit() else -1)
            self.error = status_error(
                code or grpc.StatusCode.UNKNOWN, message, instance_id, self._live()
            )
        elif self._buffer:
            why = "the stream ended inside a message"
            self.error = status_error(grpc.StatusCode.INTERNAL, why, instance_id)
        self._wake()

    def _live(self) -> bool:
        """The engine answered on a connection that still takes new streams (no GOAWAY, not
        lost): an UNAVAILABLE is then its refusal of this call, not its going away."""
        conn = self.conn
        return conn is not None and conn.usable

    def finish(self) -> None:
        """The stream is over on the wire (trailers, reset, or the connection gone)."""
        self.ended = True
        conn = self.conn
        if conn is not None:
            conn.release(self)

    def fail(self, error: EngineError, reset: bool = False) -> None:
        """Fail the call; `reset`: the fault is ours to tell the engine (RST_STREAM)."""
        if self.ended:
            return
        if self.error is None:
            error.instance_id = self._streams.instance_id
            self.error = error
        if reset and self.conn is not None and self.stream_id:
            self.conn.reset(self.stream_id, 0x2)  # INTERNAL_ERROR
        self.finish()
        self._wake()

    def cancel(self) -> None:
        """The caller is done with it: the engine's stream is reset (CANCEL) if still open."""
        self.cancelled = True
        if self.ended or not self.stream_id:
            return
        conn = self.conn
        self.finish()
        if conn is not None:
            conn.reset(self.stream_id, 0x8)


class Http2Connection(asyncio.Protocol):
    """One HTTP/2 connection to an engine and its streams (the frame loop is the hot path)."""

    def __init__(self, streams: Http2Streams) -> None:
        self._streams = streams
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, StreamCall] = {}
        self.next_id = 1
        self.usable = True  # new streams may start here (not lost, no GOAWAY)
        self.lost = False
        self._decoder = hpack.Decoder()
        self._blocks: dict[bytes, tuple[tuple[str, str], ...]] = {}  # see _decode_block
        self._reader = frames.FrameReader(MAX_MESSAGE, REFILL)
        self._on_read: Callable[[int], None] | None = None  # a Relay's (see data_received)
        self._block: list[bytes] = []  # a header block continued in CONTINUATION frames
        self._block_stream = 0
        self._block_end = False
        self.send_window = DEFAULT_WINDOW  # the engine's connection window for our data
        self.peer_initial = DEFAULT_WINDOW
        self.peer_frame = DEFAULT_FRAME
        self.peer_streams = 2**31  # SETTINGS_MAX_CONCURRENT_STREAMS (none said: no limit)
        self._blocked: deque[StreamCall] = deque()  # calls with request bytes to send
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._ping_timer: asyncio.TimerHandle | None = None
        self._ping_deadline: asyncio.TimerHandle | None = None
        self._ping_payload = b""
        self._ping_failed = False
        self._out = bytearray()  # frames queued in this loop iteration (see _write)

    # -- the connection --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        writer = cast(asyncio.Transport, transport)
        self.transport = writer
        settings = _SETTING.pack(SETTINGS_ENABLE_PUSH, 0)
        settings += _SETTING.pack(SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)
        writer.write(
            PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, _U32.pack(MAX_WINDOW - DEFAULT_WINDOW))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.usable = False
        self._out.clear()
        self._stop_keepalive()
        if self._ping_failed:
            error = status_error(
                grpc.StatusCode.UNAVAILABLE, "keepalive ping not acknowledged in time"
            )
        else:
            why = f"the connection to the engine was lost ({exc or 'closed by the engine'})"
            error = status_error(grpc.StatusCode.UNAVAILABLE, why)
        self._fail_all(error)
        self._streams.connection_gone(self)

    def _fail_all(self, error: EngineError, above: int = 0) -> None:
        for stream_id, call in list(self.calls.items()):
            if stream_id > above:
                call.fail(EngineError(error.kind, error.message))
        for waiter in self._slot_waiters:
            if not waiter.done():
                waiter.set_exception(EngineError(error.kind, error.message))
        self._slot_waiters.clear()

    def close(self) -> None:
        """Closed by the client: its calls fail `disconnected` at once."""
        self.usable = False
        self._fail_all(closed_error())
        if self.transport is not None and not self.lost:
            self._flush()
            self.transport.close()

    def _write(self, data: bytes | bytearray) -> None:
        """Queue frames for the engine. Everything queued in one loop iteration (the requests
        of the streams started together, their RST_STREAMs and WINDOW_UPDATEs) goes in one
        write on the next: one send syscall, which on loopback also runs the engine's side of
        TCP, instead of one per frame."""
        out = self._out
        if not out:
            self._loop.call_soon(self._flush)
        out += data

    def _flush(self) -> None:
        out = self._out
        if out:
            self._out = bytearray()
            if self.transport is not None and not self.lost:
                self.transport.write(out)

    # -- starting and ending streams ---------------------------------------------------------

    async def start(self, call: StreamCall, header_block: bytes, message: bytes) -> None:
        while len(self.calls) >= self.peer_streams:
            waiter = self._loop.create_future()
            self._slot_waiters.append(waiter)
            await waiter
        if not self.usable or self.transport is None:
            raise status_error(grpc.StatusCode.UNAVAILABLE, "the connection to the engine closed")
        stream_id = self.next_id
        self.next_id += 2
        call.stream_id = stream_id
        call.conn = self
        call.send_window = self.peer_initial
        self.calls[stream_id] = call
        relay = call.relay
        if relay is not None:
            self._on_read = relay.on_read
            owner = call if relay.on_first is not None else None
            self._reader.relay(stream_id, relay.sink, call.relay_id, call.relay_layout, owner)
        out = bytearray()
        limit = self.peer_frame
        if len(header_block) <= limit:
            out += frame(HEADERS, END_HEADERS, stream_id, header_block)
        else:
            out += frame(HEADERS, 0, stream_id, header_block[:limit])
            rest = header_block[limit:]
            while rest:
                chunk, rest = rest[:limit], rest[limit:]
                out += frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, chunk)
        call.unsent = b"\x00" + _U32.pack(len(message)) + message
        self._send_data(call, out)
        self._write(out)
        if call.unsent:
            self._blocked.append(call)
        if self._ping_timer is None:
            self._ping_timer = self._loop.call_later(self._streams.keepalive_time, self._keepalive)

    def _send_data(self, call: StreamCall, out: bytearray) -> None:
        """As much of the call's request as the windows allow, into `out`."""
        data = call.unsent
        while data:
            room = min(self.send_window, call.send_window, self.peer_frame)
            if room <= 0:
                break
            chunk, data = data[:room], data[room:]
            self.send_window -= len(chunk)
            call.send_window -= len(chunk)
            out += frame(DATA, 0 if data else END_STREAM, call.stream_id, chunk)
        call.unsent = data

    def _send_blocked(self) -> None:
        if not self._blocked or self.transport is None:
            return
        out = bytearray()
        waiting: deque[StreamCall] = deque()
        for call in self._blocked:
            if call.ended:
                continue
            self._send_data(call, out)
            if call.unsent:
                waiting.append(call)
        self._blocked = waiting
        if out:
            self._write(out)

    def release(self, call: StreamCall) -> None:
        """A stream ended: its slot is free for a waiting call."""
        if self.calls.pop(call.stream_id, None) is None:
            return
        if call.relay is not None:
            self._reader.forget(call.stream_id)
        if not self.usable and not self.calls and self.transport is not None:
            self._flush()
            self.transport.close()  # after GOAWAY: its last stream ended
            return
        waiters = self._slot_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def reset(self, stream_id: int, code: int) -> None:
        if self.transport is not None and not self.lost:
            self._write(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))

    # -- keepalive ---------------------------------------------------------------------------

    def _keepalive(self) -> None:
        self._ping_timer = None
        if not self.calls or self.lost or self.transport is None:
            return  # pings only while streams are open (as the grpc.aio channel's)
        self._ping_timer = self._loop.call_later(self._streams.keepalive_time, self._keepalive)
        if self._ping_deadline is not None:
            return  # the last ping is still unanswered: its deadline stands
        self._ping_payload = os.urandom(8)
        self._write(frame(PING, 0, 0, self._ping_payload))
        self._ping_deadline = self._loop.call_later(
            self._streams.keepalive_timeout, self._ping_timed_out
        )

    def _ping_timed_out(self) -> None:
        self._ping_deadline = None
        log.warning(
            "engine instance_id=%s did not answer a keepalive ping in %gs: closing its streams "
            "connection",
            self._streams.instance_id,
            self._streams.keepalive_timeout,
        )
        self._ping_failed = True
        self.usable = False
        if self.transport is not None:
            self.transport.abort()

    def _stop_keepalive(self) -> None:
        for timer in (self._ping_timer, self._ping_deadline):
            if timer is not None:
                timer.cancel()
        self._ping_timer = self._ping_deadline = None

    # -- reading (hot path) ------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """Every frame of the read, through the frame reader (frames.py): relayed streams'
        token chunks never reach Python; the other frames come back one by one."""
        reader = self._reader
        relayed = reader.relayed
        event = reader.feed(data)
        while event is not None:
            kind, flags, stream_id, payload = event
            if kind == DATA:
                self._data(flags, stream_id, payload)
            elif kind == frames.HANDBACK:
                call = self.calls.get(stream_id)
                if call is not None:
                    call.handed_back(*payload)
                    self._data_done(call, stream_id, 0)
            elif kind == HEADERS or kind == CONTINUATION:
                self._header_frame(kind, flags, stream_id, payload)
            elif kind == frames.REFILL:
                self._refill(0, payload)
            else:
                self._control(kind, flags, stream_id, payload)
            if self.lost:
                break
            event = reader.feed(b"")
        if reader.relayed != relayed:
            on_read = self._on_read
            if on_read is not None:
                on_read(reader.relayed - relayed)
            firsts = reader.take_firsts()
            if firsts is not None:
                for call in firsts:
                    call.first_relayed()

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        call = self.calls.get(stream_id)
        if call is None:
            return
        length = len(payload)
        if flags & PADDED:
            if not payload or payload[0] >= length:
                self._protocol_error("a DATA frame's padding is not shorter than the frame")
                return
            payload = payload[1 : length - payload[0]]
        call.received += length
        call.data(payload)
        self._data_done(call, stream_id, flags)

    def _data_done(self, call: StreamCall, stream_id: int, flags: int) -> None:
        if flags & END_STREAM and not call.ended:
            call.headers([], True)  # no trailers: INTERNAL, as gRPC says
        elif call.received >= REFILL:
            self._refill(stream_id, call.received)
            call.received = 0

    def _refill(self, stream_id: int, amount: int) -> None:
        self._write(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(amount)))

    def _header_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == HEADERS:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._block = [payload]
            self._block_stream = stream_id
            self._block_end = bool(flags & END_STREAM)
        else:
            self._block.append(payload)
        if not flags & END_HEADERS:
            return
        try:
            block = self._decode_block(b"".join(self._block))
        except hpack.HPACKError as exc:
            self._protocol_error(f"undecodable headers: {exc}")
            return
        self._block = []
        call = self.calls.get(self._block_stream)
        if call is not None:
            call.headers(block, self._block_end)

    def _decode_block(self, data: bytes) -> tuple[tuple[str, str], ...]:
        """A header block's headers. The decoder keeps the connection's HPACK table, so every
        block that may change it goes through the decoder. An engine's blocks repeat byte for
        byte (every response's status and content type, every success's trailers), as indexed
        references once the table holds their headers: a block whose decoding left the table
        as it was decodes the same while the table stays so, and is kept by its bytes until
        the table changes (per request, two decodes in Python fewer)."""
        known = self._blocks.get(data)
        if known is not None:
            return known
        table = self._decoder.header_table
        entries = table.dynamic_entries
        # An insertion puts a new entry first (kept alive here, so it cannot be this one),
        # an eviction or a clear shortens the table, a size update changes its size.
        first, count, size = entries[0] if entries else None, len(entries), table.maxsize
        block: tuple[tuple[str, str], ...] = tuple(self._decoder.decode(data))  # type: ignore[arg-type]
        blocks = self._blocks
        same = (entries[0] if entries else None) is first and len(entries) == count
        if same and table.maxsize == size:
            if len(blocks) < MAX_KNOWN_BLOCKS:
                blocks[data] = block
        elif blocks:
            blocks.clear()  # the indexes the known blocks refer to may mean other headers now
        return block

    def _control(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        transport = self.transport
        assert transport is not None
        if kind == SETTINGS:
            if flags & ACK:
                return
            for offset in range(0, len(payload) - 5, 6):
                key, value = _SETTING.unpack_from(payload, offset)
                if key == SETTINGS_INITIAL_WINDOW_SIZE:
                    delta = value - self.peer_initial
                    self.peer_initial = value
                    for call in self.calls.values():
                        call.send_window += delta
                elif key == SETTINGS_MAX_FRAME_SIZE:
                    self.peer_frame = value
                elif key == SETTINGS_MAX_CONCURRENT_STREAMS:
                    self.peer_streams = value
            self._write(frame(SETTINGS, ACK, 0))
            self._send_blocked()
        elif kind == WINDOW_UPDATE:
            increment = _U32.unpack(payload[:4])[0] & 0x7FFFFFFF
            if stream_id == 0:
                self.send_window += increment
            else:
                target = self.calls.get(stream_id)
                if target is None:
                    return
                target.send_window += increment
            self._send_blocked()
        elif kind == PING:
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
            elif payload == self._ping_payload and self._ping_deadline is not None:
                self._ping_deadline.cancel()
                self._ping_deadline = None
        elif kind == RST_STREAM:
            reset = self.calls.get(stream_id)
            if reset is not None:
                code = _U32.unpack(payload[:4])[0]
                status = _RST_STATUS.get(code, grpc.StatusCode.INTERNAL)
                why = f"the engine reset the stream (code {code})"
                reset.fail(status_error(status, why, connected=self.usable))
        elif kind == GOAWAY:
            last = _U32.unpack(payload[:4])[0] & 0x7FFFFFFF
            code = _U32.unpack(payload[4:8])[0]
            debug = payload[8:].decode(errors="replace")
            self.usable = False
            log.info(
                "engine instance_id=%s sent GOAWAY (code %d%s): new streams open a new connection",
                self._streams.instance_id,
                code,
                f", {debug}" if debug else "",
            )
            why = f"the engine is going away (GOAWAY code {code}) and did not take the stream"
            self._fail_all(status_error(grpc.StatusCode.UNAVAILABLE, why), above=last)
            self._streams.connection_gone(self)
            if not self.calls:
                self._flush()
                transport.close()
        elif kind == PUSH_PROMISE:
            self._protocol_error("the engine sent PUSH_PROMISE (push is off)")
        # PRIORITY and unknown frame types are ignored, as HTTP/2 says.

    def _protocol_error(self, why: str) -> None:
        log.warning("engine instance_id=%s: %s", self._streams.instance_id, why)
        self._fail_all(status_error(grpc.StatusCode.INTERNAL, why))
        if self.transport is not None:
            self._flush()
            self.transport.write(frame(GOAWAY, 0, 0, _U32.pack(0) + _U32.pack(0x1)))
            self.transport.abort()
        self.lost = True  # read no further; connection_lost follows
        self.usable = False
        self._streams.connection_gone(self)


class Http2Streams:
    """The streaming calls of one engine client: opens (and re-opens) its connection."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        instance_id: int | None = None,
        keepalive_time: float = 12.0,
        keepalive_timeout: float = 4.0,
    ) -> None:
        self.host = host
        self.port = port
        self.authority = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self.instance_id = instance_id
        self.keepalive_time = keepalive_time
        self.keepalive_timeout = keepalive_timeout
        self._conn: Http2Connection | None = None
        self._connecting: asyncio.Future[Http2Connection] | None = None
        self._draining: set[Http2Connection] = set()  # after GOAWAY, until their streams end
        self._prefixes: dict[str, bytes] = {}
        self.closed = False

    def call(
        self,
        path: str,
        message: bytes,
        decode: Callable[[bytes], Any],
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> StreamCall:
        """A call of `path` (`/package.Service/Method`) with one request message; it starts
        when first iterated."""
        block = self._prefixes.get(path)
        if block is None:
            scheme = "https" if self._ssl is not None else "http"
            block = self._prefixes[path] = encode_headers(
                [
                    (":method", "POST"),
                    (":scheme", scheme),
                    (":path", path),
                    (":authority", self.authority),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                    ("user-agent", "switchyard-http2"),
                ]
            )
        if metadata:
            block += encode_headers(list(metadata))
        return StreamCall(self, (block, message), decode)

    async def start(self, call: StreamCall, request: tuple[bytes, bytes]) -> None:
        if self.closed:
            raise closed_error(self.instance_id)
        try:
            conn = await self._connection()
            await conn.start(call, *request)
        except EngineError as exc:
            exc.instance_id = self.instance_id
            raise

    async def _connection(self) -> Http2Connection:
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            # Shielded: a call cancelled while it waits leaves the connect to the others.
            return await asyncio.shield(connecting)
        except asyncio.CancelledError:
            if not connecting.cancelled():  # the caller's own cancellation
                raise
            # close() cancelled the connect: the call fails as the close's other calls do.
            raise closed_error(self.instance_id) from None
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _connect(self) -> Http2Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, conn = await loop.create_connection(
                    lambda: Http2Connection(self),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self._server_hostname if self._ssl is not None else None,
                )
        except TimeoutError:
            why = f"no connection to the engine in {CONNECT_TIMEOUT:g}s"
            raise status_error(grpc.StatusCode.UNAVAILABLE, why, self.instance_id) from None
        except OSError as exc:  # refused, unreachable, TLS handshake (ssl.SSLError)
            why = f"failed to connect to {self.authority}: {exc}"
            raise status_error(grpc.StatusCode.UNAVAILABLE, why, self.instance_id) from None
        if self.closed:
            conn.close()
            raise closed_error(self.instance_id)
        self._conn = conn
        return conn

    def connection_gone(self, conn: Http2Connection) -> None:
        """A connection takes no new streams (lost, GOAWAY): the next call opens another."""
        if self._conn is conn:
            self._conn = None
        if not conn.lost and conn.calls:
            self._draining.add(conn)
        else:
            self._draining.discard(conn)

    async def close(self) -> None:
        """Every connection closed; calls still open fail `disconnected`."""
        self.closed = True
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
        for conn in [self._conn, *self._draining]:
            if conn is not None:
                conn.close()
        self._conn = None
        self._draining.clear()
