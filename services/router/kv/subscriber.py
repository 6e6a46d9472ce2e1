"""Connect mode: a SUB connected to one engine rank's bound PUB socket, feeding its KvStream.

An engine binds its publisher when the endpoint names a wildcard host (`tcp://*:5557`); data-
parallel rank r binds base port + r, its replay ROUTER likewise (`rank_endpoint`). The SUB is
connected before the stream's catch-up replay starts: a batch published between the replay's
snapshot and a late subscription would be lost, and an engine that then stays idle would
never reveal the gap.

Messages are read by a `LoopSocket` (the socket's FD watched by the event loop, every ready
message fed to the stream from the read callback) rather than one awaited recv per message:
zmq.asyncio's future, task wake-up and reader re-arming per batch were most of a batch's
cost at low load.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import zmq
import zmq.asyncio

from switchyard.common.messaging import LoopSocket
from switchyard.router.kv.decode import split_frames
from switchyard.router.kv.errors import KvDecodeError
from switchyard.router.kv.stream import KvStream
from switchyard.router.kv.types import KvCounters

log = logging.getLogger(__name__)

_WILDCARD_HOSTS = ("*", "0.0.0.0", "[::]", "::", "")


def resolve_endpoint(endpoint: str, host: str | None) -> str:
    """An endpoint an engine advertises for binding (`tcp://*:5557`, `tcp://0.0.0.0:5557`) as
    one we can connect to: the wildcard replaced by the engine's `host`."""
    scheme, sep, rest = endpoint.partition("://")
    if scheme != "tcp" or not sep or not host:
        return endpoint
    address, colon, port = rest.rpartition(":")
    if not colon or address not in _WILDCARD_HOSTS:
        return endpoint
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def rank_endpoint(endpoint: str, rank: int) -> str:
    """Data-parallel rank r's endpoint: tcp port + r (both engines' `offset_endpoint_port`),
    `_dp{r}` appended to an inproc name, anything else unchanged."""
    if not rank:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        address, colon, port = endpoint.rpartition(":")
        if colon and port.isdigit():
            return f"{address}:{int(port) + rank}"
    return endpoint


class ZmqKvSource:
    """Follows one rank's PUB socket until cancelled; the stream belongs to the caller."""

    def __init__(
        self,
        stream: KvStream,
        counters: KvCounters,
        context: zmq.asyncio.Context,
        *,
        endpoint: str,
        handshake_timeout: float = 2.0,
    ) -> None:
        """`endpoint` must be connectable (see resolve_endpoint)."""
        self.stream = stream
        self.endpoint = endpoint
        self._counters = counters
        self._context = context
        self._handshake_timeout = handshake_timeout

    async def run(self) -> None:
        stream = self.stream
        # A plain socket under the LoopSocket (its monitor, from the asyncio context, is
        # awaitable).
        sub: zmq.Socket[bytes] = zmq.Socket(self._context, zmq.SUB)
        io: LoopSocket | None = None
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, 0)  # never drop: a drop is a gap and costs a replay
            # An endpoint nobody binds (an engine whose publisher connects elsewhere) is
            # retried with a backoff, not every 100 ms.
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            # A socket of the context's kind: an asyncio one.
            monitor = cast(
                zmq.asyncio.Socket, sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            )
            sub.connect(self.endpoint)
            # poll, not asyncio.wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that races its inner future, and the source would then never stop.
            try:
                if not await monitor.poll(int(self._handshake_timeout * 1000)):
                    log.info(
                        "kv events worker=%s: %s not reachable yet", stream.name, self.endpoint
                    )
            finally:
                sub.disable_monitor()
                monitor.close(linger=0)
            log.info(
                "kv events subscribed worker=%s endpoint=%s replay=%s",
                stream.name,
                self.endpoint,
                stream.replay_endpoint,
            )
            stream.start()  # the SUB is connected: replay the buffer now
            io = LoopSocket(sub, self._on_message, multipart=True)
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            if io is not None:
                io.close()
            else:
                sub.close(linger=0)

    def _on_message(self, frames: list[bytes]) -> None:
        try:
            seq, payload = split_frames(frames)
        except KvDecodeError as exc:
            self._counters.decode_errors += 1
            log.warning("kv events worker=%s: %s", self.stream.name, exc)
            return
        self.stream.feed(seq, payload)
