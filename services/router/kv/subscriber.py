"""Connect mode: a SUB connected to one engine rank's bound PUB socket, feeding its KvStream.

An engine binds its publisher when the endpoint names a wildcard host (`tcp://*:5557`); data-
parallel rank r binds base port + r, its replay ROUTER likewise (`rank_endpoint`).

Every time the SUB's connection is made (the first time, and again after the engine restarted
or bound late) the socket monitor reports it and the stream catches up from its last applied
sequence (`KvStream.reconnected`): what the engine published before the subscription reached
it was dropped by its PUB socket, and an engine that then stays idle would never reveal the
gap. The catch-up starts after the connection is made, so a batch published between the
replay's snapshot and the subscription cannot be lost either. The reconnect interval backs
off from 100 ms to `RECONNECT_MAX_MS` for an endpoint nobody binds (an engine that is down,
or whose publisher connects elsewhere): each retry is a connect() in ZMQ's I/O thread, no
Python wake-up, and a publisher that binds late is connected to within that interval.

Messages are read by a `LoopSocket` (the socket's FD watched by the event loop, every ready
message fed to the stream from the read callback) rather than one awaited recv per message:
zmq.asyncio's future, task wake-up and reader re-arming per batch were most of a batch's
cost at low load.
"""

from __future__ import annotations

import logging
from typing import cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from switchyard.common.messaging import LoopSocket
from switchyard.router.kv.decode import split_frames
from switchyard.router.kv.errors import KvDecodeError
from switchyard.router.kv.stream import KvStream
from switchyard.router.kv.types import KvCounters

log = logging.getLogger(__name__)

RECONNECT_MAX_MS = 500  # the backoff's ceiling: a late bind is indexed within about this
_MONITORED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED

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
        reconnect_max_ms: int = RECONNECT_MAX_MS,
    ) -> None:
        """`endpoint` must be connectable (see resolve_endpoint)."""
        self.stream = stream
        self.endpoint = endpoint
        self._counters = counters
        self._context = context
        self._reconnect_max_ms = reconnect_max_ms

    async def run(self) -> None:
        stream = self.stream
        # A plain socket under the LoopSocket (its monitor, from the asyncio context, is
        # awaitable).
        sub: zmq.Socket[bytes] = zmq.Socket(self._context, zmq.SUB)
        io: LoopSocket | None = None
        monitor: zmq.asyncio.Socket | None = None
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, 0)  # never drop: a drop is a gap and costs a replay
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, self._reconnect_max_ms)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            # A socket of the context's kind: an asyncio one.
            monitor = cast(zmq.asyncio.Socket, sub.get_monitor_socket(_MONITORED))
            sub.connect(self.endpoint)
            log.info(
                "kv events subscribing worker=%s endpoint=%s replay=%s",
                stream.name,
                self.endpoint,
                stream.replay_endpoint,
            )
            io = LoopSocket(sub, self._on_message, multipart=True)
            while True:  # until cancelled
                event = parse_monitor_message(await monitor.recv_multipart())["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    log.info(
                        "kv events connected worker=%s endpoint=%s", stream.name, self.endpoint
                    )
                    stream.reconnected()
                elif event == zmq.EVENT_DISCONNECTED:
                    log.info(
                        "kv events disconnected worker=%s endpoint=%s", stream.name, self.endpoint
                    )
                    stream.disconnected()
        finally:
            if monitor is not None:
                sub.disable_monitor()
                monitor.close(linger=0)
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
