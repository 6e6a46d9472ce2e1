"""Publishers that connect: the router's own SUB sockets that any number of engines publish
into, told apart by topic.

vLLM and SGLang connect their PUB socket (instead of binding it) whenever the configured
endpoint names a host: the common Kubernetes set-up points every engine at the router's
address, with a topic naming the engine (`kv@<pod-ip>@<model>`). Data-parallel rank r
connects to base port + r, so this listener has one SUB per rank port (`base + r`, added as
instances with more ranks appear); the socket a message came in on is its rank.

Mode: `bind` (the router binds the SUBs; engines connect to it; a port 0 binds a free port
for rank 0, and rank r then binds that port + r) or `connect` (the router
connects its SUBs to a KV-event proxy's backend, see `kv.proxy`: router replicas all get every
engine's events that way).

Telling engines apart (`register`): each instance's topic comes from a pattern (placeholders
{host}, {port}, {model}, {instance_id}, {url}); a message whose topic names no instance is
matched by the TCP peer address of its publisher instead (the instance whose URL host that is,
when exactly one instance has it), else counted (`unknown_topic`) and reported once per topic
that stays unknown past a grace period (engines publish before fleet has probed them).
Instances with the same topic (the engines' default is "") are told apart by the publisher's
host when exactly one of them is on it; otherwise the topic is reported and none of them gets
its messages.
Replay goes to each engine's own replay ROUTER, which engines always bind.

A publisher that connects drops whatever it publishes before its connection is made and our
subscription has reached it: an engine that starts (or restarts) and publishes one burst would
never be heard. So every connection made to a rank's socket is a catch-up for the streams of
the publisher's host (all of the rank's streams when the host names none), each from its last
applied sequence (`KvStream.reconnected`): the socket monitor reports the accepted peer in
bind mode; in connect mode the kv-proxy forwards a notice (`PROXY_NOTICE_TOPIC`, payload the
peer's host) when an engine connects to it, and the proxy's own (re)connection catches up
every stream.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from switchyard.common.ports import PortRange, zmq_bind
from switchyard.router.kv.stream import KvStream
from switchyard.router.kv.subscriber import rank_endpoint
from switchyard.router.kv.types import KvCounters

log = logging.getLogger(__name__)

TOPIC_FIELDS = ("host", "port", "model", "instance_id", "url")
DEFAULT_TOPIC_PATTERN = "kv@{host}@{model}"
_REPORTED_TOPICS = 256  # unknown topics remembered (reported once each)
# What `switchyard kv-proxy` forwards when an engine connects to it (payload: the peer host).
PROXY_NOTICE_TOPIC = b"\x00switchyard/kv-proxy/connected"
_MONITORED = zmq.EVENT_ACCEPTED | zmq.EVENT_HANDSHAKE_SUCCEEDED


def peer_host(fd: int) -> str | None:
    """The remote address of an accepted TCP connection's descriptor (None: not TCP, or
    gone already)."""
    try:
        with socket.socket(fileno=socket.dup(fd)) as conn:
            peer = conn.getpeername()
    except OSError:
        return None
    return peer[0] if isinstance(peer, tuple) else None


def check_topic_pattern(pattern: str) -> str:
    """The pattern, or ValueError naming the placeholder it does not know."""
    for _, name, spec, conversion in string.Formatter().parse(pattern):
        if name is None:
            continue
        if name not in TOPIC_FIELDS or spec or conversion:
            raise ValueError(
                f"KV topic pattern {pattern!r}: unknown placeholder {{{name}}} "
                f"(use {', '.join('{' + f + '}' for f in TOPIC_FIELDS)})"
            )
    return pattern


@dataclass(slots=True)
class _Entry:
    instance_id: int
    streams: list[KvStream]  # by rank
    host: str | None = None
    topic: bytes = b""


@dataclass(slots=True)
class _Route:
    entries: list[_Entry] = field(default_factory=list)


class TopicListener:
    def __init__(
        self,
        context: zmq.asyncio.Context,
        counters: KvCounters,
        *,
        endpoint: str,
        mode: str = "bind",
        unknown_grace: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        ports: PortRange | None = None,
    ) -> None:
        if mode not in ("bind", "connect"):
            raise ValueError(f"listener mode must be bind or connect, got {mode!r}")
        self.endpoint = endpoint
        self.mode = mode
        self._ports = ports  # where a port 0 to bind is searched
        self._context = context
        self._counters = counters
        self._sockets: list[zmq.asyncio.Socket] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.endpoints: list[str] = []  # what each rank's socket bound or connected
        self._by_topic: dict[bytes, _Route] = {}
        self._by_host: dict[str, _Route] = {}
        self._entries: dict[int, _Entry] = {}
        self._reported: set[bytes] = set()
        self._first_unknown: dict[bytes, float] = {}
        self.unknown_grace = unknown_grace
        self._clock = clock
        self._closed = False
        self.on_unknown: Callable[[bytes, str | None], None] | None = None

    # ---- sockets ------------------------------------------------------------------------

    def ensure_ranks(self, ranks: int) -> None:
        """Listen on the ports of ranks 0..ranks-1 (bind failures raise zmq.ZMQError)."""
        while len(self._sockets) < ranks and not self._closed:
            rank = len(self._sockets)
            sock = self._context.socket(zmq.SUB)
            try:
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.RCVHWM, 0)
                sock.setsockopt(zmq.SUBSCRIBE, b"")
                where = rank_endpoint(self.endpoint, rank)
                if self.mode == "bind":
                    where = zmq_bind(sock, where, self._ports)
                    if rank == 0:  # a port 0 resolved: the other ranks follow the bound one
                        self.endpoint = where
                else:
                    sock.connect(where)
            except (zmq.ZMQError, OSError):
                sock.close(linger=0)
                raise
            self._sockets.append(sock)
            self.endpoints.append(where)
            log.info("kv events %s SUB rank=%d at %s", self.mode, rank, where)
            loop = asyncio.get_running_loop()
            monitor = cast(zmq.asyncio.Socket, sock.get_monitor_socket(_MONITORED))
            self._tasks.append(
                loop.create_task(self._receive(sock, rank), name=f"kv-listener:{rank}")
            )
            self._tasks.append(
                loop.create_task(
                    self._watch(sock, monitor, rank), name=f"kv-listener-monitor:{rank}"
                )
            )

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sock in self._sockets:
            sock.close(linger=0)
        self._tasks.clear()
        self._sockets.clear()

    # ---- instances ----------------------------------------------------------------------

    def register(
        self, instance_id: int, topic: str, host: str | None, streams: list[KvStream]
    ) -> None:
        """Route `topic` (and, as a fallback, the publisher host) to the instance's streams,
        one per rank."""
        self.unregister(instance_id)
        entry = _Entry(instance_id, streams, host, topic.encode("utf-8"))
        self._entries[instance_id] = entry
        self._by_topic.setdefault(entry.topic, _Route()).entries.append(entry)
        if host:
            self._by_host.setdefault(host, _Route()).entries.append(entry)
        route = self._by_topic[entry.topic]
        if len(route.entries) > 1:
            log.warning(
                "kv events: topic %r names instances %s: told apart by host only "
                "(use a --kv-topic-pattern with {port} or {instance_id})",
                topic,
                ", ".join(str(e.instance_id) for e in route.entries),
            )
        self.ensure_ranks(len(streams))

    def unregister(self, instance_id: int) -> None:
        entry = self._entries.pop(instance_id, None)
        if entry is None:
            return
        for table, key in ((self._by_topic, entry.topic), (self._by_host, entry.host)):
            if key is None:
                continue
            route = table.get(key)  # type: ignore[arg-type]
            if route is not None:
                route.entries = [e for e in route.entries if e is not entry]
                if not route.entries:
                    del table[key]  # type: ignore[arg-type]

    # ---- connections --------------------------------------------------------------------

    async def _watch(
        self, sock: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket, rank: int
    ) -> None:
        """A connection made to this rank's socket: the publisher's streams catch up."""
        peers: list[str | None] = []  # accepted, handshake not yet reported
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                kind = event["event"]
                if kind == zmq.EVENT_ACCEPTED:
                    peers.append(peer_host(int(event["value"])))
                elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    hosts, peers = (peers or [None]), []
                    for host in hosts:
                        self.publisher_connected(rank, host)
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)

    def publisher_connected(self, rank: int, host: str | None) -> None:
        """Catch up the rank's streams of the instances on `host` (every one when no
        instance is on it, or for None)."""
        entries = [e for e in self._entries.values() if rank < len(e.streams)]
        if host is not None:
            on_host = [e for e in entries if e.host == host]
            entries = on_host or entries
        log.info(
            "kv events: a publisher connected to rank %d (from %s): catching up %d stream(s)",
            rank,
            host or "the proxy",
            len(entries),
        )
        for entry in entries:
            entry.streams[rank].reconnected()

    # ---- messages -----------------------------------------------------------------------

    async def _receive(self, sock: zmq.asyncio.Socket, rank: int) -> None:
        recv = sock.recv_multipart
        while True:
            frames = await recv(copy=False)
            if len(frames) < 3 or len(frames[-2]) != 8:
                self._counters.decode_errors += 1
                continue
            self.deliver(frames, rank)

    def deliver(self, frames: list[zmq.Frame], rank: int) -> None:
        """One message [topic, seq, payload] that came in on `rank`'s socket."""
        topic = frames[0].bytes
        if topic == PROXY_NOTICE_TOPIC:
            notice = frames[-1].bytes.decode("utf-8", "replace")
            self.publisher_connected(rank, notice or None)
            return
        route = self._by_topic.get(topic)
        entry = route.entries[0] if route is not None and len(route.entries) == 1 else None
        if entry is None:  # no instance has the topic, or several (the engines' default "")
            host = str(frames[0].get("Peer-Address")) if self.mode == "bind" else None
            by_host = self._by_host.get(host) if host else None
            candidates = (
                [e for e in by_host.entries if e in route.entries]
                if by_host is not None and route is not None
                else (by_host.entries if by_host is not None else [])
            )
            if len(candidates) == 1:
                entry = candidates[0]
            else:
                self._unknown(topic, host)
                return
        if entry is None or rank >= len(entry.streams):
            self._unknown(topic, None)
            return
        seq = int.from_bytes(frames[-2].bytes, "big")
        entry.streams[rank].feed(seq, frames[-1].bytes)

    def _unknown(self, topic: bytes, host: str | None) -> None:
        """Count; report a topic once it has been unknown for `unknown_grace` seconds (an
        engine publishes before fleet has probed it: its first batches are dropped, and
        replay fills them in once it is known)."""
        self._counters.unknown_topic += 1
        if topic in self._reported:
            return
        now = self._clock()
        first = self._first_unknown.get(topic)
        if first is None:
            if len(self._first_unknown) >= _REPORTED_TOPICS:
                return
            first = self._first_unknown[topic] = now
        if now - first < self.unknown_grace or len(self._reported) >= _REPORTED_TOPICS:
            return
        self._reported.add(topic)
        log.warning(
            "kv events on %s with topic %r from %s name no known worker for %.0f s: dropped "
            "(check the engines' kv-events topic against --kv-topic-pattern)",
            self.endpoint,
            topic.decode("utf-8", "replace"),
            host or "an unknown peer",
            now - first,
        )
        if self.on_unknown is not None:
            self.on_unknown(topic, host)
