"""An engine connection's HTTP/2 frames, and the relay of plain token chunks (the hot path).

`FrameReader` splits the bytes read from an engine's HTTP/2 connection into frames and hands
every frame to the connection (http2.Http2Connection) as an event, except the DATA frames of
*relayed* streams: their gRPC messages are read here, and each plain token chunk (a
GenerateResponse holding only a `chunk` with token ids and counts) is written straight into
the stream's `ReplyBatch` as the msgpack TokenDelta the dispatcher sends its preprocessor. No
Python object per token, and in the C form (_frames.c) no Python frame per read beyond the
connection's `data_received`. The first message of a relayed stream that is anything else
(its `complete`, logprobs, a field this reader does not know, a compressed or oversized
message), and any frame that ends the stream, hands the stream back: a HANDBACK event carries
its undelivered bytes and counts, and the stream is the connection's again, for good.

Events are tuples `(kind, flags, stream_id, payload)`:
  - a frame's own type (DATA of a stream not relayed, HEADERS, SETTINGS, ...): its raw payload;
  - HANDBACK: payload `(data, received, tokens)`: the stream's bytes not yet delivered (whole
    or partial gRPC messages, to read as the connection reads any DATA), the DATA bytes it
    received while relayed (flow control), and the token ids relayed;
  - REFILL: payload the connection-level DATA bytes to give back (a WINDOW_UPDATE on stream 0)
    once `refill` bytes were read.
`feed(data)` returns the first event, `feed(b"")` the next; None once every complete frame is
read. Frames of one stream keep their order; tokens relayed before a handback are in the
batch before anything the connection emits after it. `relayed` counts the TokenDeltas
written so far; `take_firsts()` the owners of streams whose first delta was written.

A plain chunk, in either family's GenerateResponse (`layout`: the field number of `chunk`,
SGLANG 2 with a string request_id at 1, VLLM 1), is a message whose fields are the request id
(ASCII only) and exactly one `chunk` holding only token_ids (packed or not, each below 2^32)
and the counts (prompt, completion, cached, reasoning tokens, index), every varint at most 5
bytes long. Whatever else protobuf would accept is handed back and read by protobuf, so the
relay never decodes a message differently from it.

`ReplyBatch`: the replies for one peer, encoded, until `take()` gives them as one msgpack
array (what codec.encode(list) gives).

`PyFrameReader` and `PyReplyBatch` are the pure-Python forms; `_frames.c` is the C form, of
identical output (tests/test_frames_parity.py). `FrameReader` and `ReplyBatch` are the C ones
when the extension is built and not turned off (common.native), else the Python ones;
`NATIVE` says which.
"""

from __future__ import annotations

from typing import Any

from switchyard.common import native
from switchyard.protos.codec import encode
from switchyard.protos.messages import TokenDelta

DATA, HEADERS = 0, 1
END_STREAM = 0x1
PADDED = 0x8
HANDBACK = 0x100
REFILL = 0x101
SGLANG = 2  # GenerateResponse: request_id = 1, chunk = 2, complete = 3
VLLM = 1  # GenerateResponse: chunk = 1, complete = 2

# Varint fields of a chunk, per layout: prompt, completion, cached tokens, then SGLang's
# index (8) and reasoning_tokens (9), vLLM's index (7).
_COUNTS = {SGLANG: frozenset({2, 3, 4, 8, 9}), VLLM: frozenset({2, 3, 4, 7})}
_U32 = 0xFFFFFFFF

Event = tuple[int, int, int, Any]


def _varint(data: bytes, pos: int, end: int, most: int) -> tuple[int, int]:
    """(value, next position) of a varint of at most `most` bytes; (-1, pos) if it runs past
    `end` or is longer."""
    value = shift = 0
    for i in range(pos, min(end, pos + most)):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    return -1, pos


def _chunk_ids(data: bytes, pos: int, end: int, counts: frozenset[int]) -> list[int] | None:
    ids: list[int] = []
    while pos < end:
        tag, pos = _varint(data, pos, end, 5)
        if tag < 0:
            return None
        field, wire = tag >> 3, tag & 7
        if field == 1 and wire == 2:
            size, pos = _varint(data, pos, end, 5)
            if size < 0 or size > end - pos:
                return None
            stop = pos + size
            while pos < stop:
                value, pos = _varint(data, pos, stop, 5)
                if value < 0 or value > _U32:
                    return None
                ids.append(value)
        elif field == 1 and wire == 0:
            value, pos = _varint(data, pos, end, 5)
            if value < 0 or value > _U32:
                return None
            ids.append(value)
        elif field in counts and wire == 0:
            value, pos = _varint(data, pos, end, 5)
            if value < 0:
                return None
        else:
            return None
    return ids


def plain_chunk(data: bytes, layout: int) -> list[int] | None:
    """The token ids of a GenerateResponse that is a plain chunk (see the module docstring),
    else None."""
    pos, end = 0, len(data)
    chunk: tuple[int, int] | None = None
    while pos < end:
        tag, pos = _varint(data, pos, end, 5)
        if tag < 0 or tag & 7 != 2:
            return None
        size, pos = _varint(data, pos, end, 5)
        if size < 0 or size > end - pos:
            return None
        field = tag >> 3
        if field == layout and chunk is None:
            chunk = (pos, pos + size)
        elif not (field == 1 and layout == SGLANG and data[pos : pos + size].isascii()):
            return None
        pos += size
    if chunk is None:
        return None
    return _chunk_ids(data, chunk[0], chunk[1], _COUNTS[layout])


class PyReplyBatch:
    """Encoded replies for one peer; `take()` is them as one msgpack array (None: none)."""

    __slots__ = ("_body", "count")

    def __init__(self) -> None:
        self._body = bytearray()
        self.count = 0

    def append(self, encoded: bytes) -> None:
        """One reply, msgpack-encoded (codec.encode)."""
        self._body += encoded
        self.count += 1

    def take(self) -> bytes | None:
        count = self.count
        if not count:
            return None
        if count < 16:
            head = bytes((0x90 | count,))
        elif count < 0x10000:
            head = b"\xdc" + count.to_bytes(2, "big")
        else:
            head = b"\xdd" + count.to_bytes(4, "big")
        out = head + self._body
        self._body = bytearray()
        self.count = 0
        return out


class _Relay:
    __slots__ = ("sink", "request_id", "layout", "partial", "received", "tokens", "owner")

    def __init__(self, sink: PyReplyBatch, request_id: str, layout: int, owner: Any) -> None:
        self.sink = sink
        self.request_id = request_id
        self.layout = layout
        self.partial = b""  # a message split across DATA frames
        self.received = 0  # DATA bytes (flow control)
        self.tokens = 0
        self.owner = owner  # told once its first delta is written (None: not asked)


class PyFrameReader:
    """The frames of one HTTP/2 connection (see the module docstring)."""

    def __init__(self, max_message: int, refill: int) -> None:
        if max_message < 0 or refill < 1:
            raise ValueError("max_message must be >= 0 and refill >= 1")
        self.max_message = max_message
        self.refill = refill
        self.relayed = 0
        self.received = 0  # connection DATA bytes since the last REFILL
        self._buf = b""
        self._pos = 0
        self._relays: dict[int, _Relay] = {}
        self._firsts: list[Any] = []

    def relay(
        self, stream_id: int, sink: PyReplyBatch, request_id: str, layout: int, owner: Any = None
    ) -> None:
        """From now on, plain chunks of `stream_id` go to `sink` as TokenDeltas of
        `request_id`; `owner` (if not None) is in `take_firsts()` once the first one went."""
        if layout not in _COUNTS:
            raise ValueError(f"unknown layout {layout}")
        if not isinstance(sink, PyReplyBatch):
            raise TypeError("sink must be a ReplyBatch")
        self._relays[stream_id] = _Relay(sink, request_id, layout, owner)

    def forget(self, stream_id: int) -> None:
        """The stream is over: nothing of it is relayed any more (its partial bytes dropped)."""
        self._relays.pop(stream_id, None)

    def take_firsts(self) -> list[Any] | None:
        firsts = self._firsts
        if not firsts:
            return None
        self._firsts = []
        return firsts

    def feed(self, data: bytes) -> Event | None:
        if data:
            pos = self._pos
            self._buf = self._buf[pos:] + data if pos < len(self._buf) else bytes(data)
            self._pos = 0
        return self._next()

    def _next(self) -> Event | None:
        buf = self._buf
        size = len(buf)
        relays = self._relays
        while True:
            if self.received >= self.refill:
                amount, self.received = self.received, 0
                return (REFILL, 0, 0, amount)
            pos = self._pos
            if size - pos < 9:
                return None
            length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
            end = pos + 9 + length
            if end > size:
                return None
            kind = buf[pos + 3]
            flags = buf[pos + 4]
            stream_id = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            relay = relays.get(stream_id) if kind <= HEADERS else None
            if relay is not None and (
                kind == HEADERS
                and flags & END_STREAM
                or kind == DATA
                and (flags & (END_STREAM | PADDED) or relay.received + length >= self.refill)
            ):
                # The frame ends the stream (or needs what only the connection does): the
                # stream goes back first, the frame comes next as itself.
                del relays[stream_id]
                return (HANDBACK, 0, stream_id, (relay.partial, relay.received, relay.tokens))
            self._pos = end
            if kind == DATA:
                self.received += length
                if relay is not None:
                    relay.received += length
                    event = self._relay(stream_id, relay, buf[pos + 9 : end])
                    if event is not None:
                        return event
                    continue
            return (kind, flags, stream_id, buf[pos + 9 : end])

    def _relay(self, stream_id: int, relay: _Relay, payload: bytes) -> Event | None:
        data = relay.partial + payload if relay.partial else payload
        pos, size = 0, len(data)
        while size - pos >= 5:
            length = int.from_bytes(data[pos + 1 : pos + 5], "big")
            end = pos + 5 + length
            ids = None
            if not data[pos] and length <= self.max_message:
                if end > size:
                    break
                ids = plain_chunk(data[pos + 5 : end], relay.layout)
            if ids is None:
                del self._relays[stream_id]
                return (HANDBACK, 0, stream_id, (data[pos:], relay.received, relay.tokens))
            if ids:
                relay.sink.append(encode(TokenDelta(relay.request_id, ids)))
                relay.tokens += len(ids)
                self.relayed += 1
                if relay.owner is not None:
                    self._firsts.append(relay.owner)
                    relay.owner = None
            pos = end
        relay.partial = data[pos:]
        return None


_c = native.load("switchyard.common.engines._frames")
NATIVE = _c is not None
FrameReader: type[PyFrameReader] = _c.FrameReader if _c is not None else PyFrameReader
ReplyBatch: type[PyReplyBatch] = _c.ReplyBatch if _c is not None else PyReplyBatch
