"""The KV events on ZMQ, framed as the engines' `ZmqEventPublisher` frames them.

PUB (at --kv-events-endpoint): every batch as `[topic, seq (8 bytes big-endian), payload]`,
except the sequence numbers in --kv-skip-seq (fault injection: they stay in the replay
buffer, so a subscriber sees a gap and must replay). Bound or connected by the engines' rule
(`publisher_binds`): bound when the endpoint has a `*` or `::` (a wildcard host) or is ipc /
inproc, connected otherwise, as when engines point their publisher at a router that binds.
A port 0 is also bound (a free port searched in the port range): there is nothing to connect
to at port 0, so this is the mock's way to say "bind any port" on a named host.
Data-parallel rank r uses base port + r for both sockets (`rank_endpoint`); with a port 0, rank
0 binds a free port and rank r binds that port + r (`follow_rank0`).

ROUTER (bound at --kv-replay-endpoint): a DEALER sends `[b"", start_seq (8 bytes big-endian)]`
and gets every buffered batch numbered >= start_seq as `[b"", seq, payload]` (with
--kv-replay-topic-frame: `[b"", topic, seq, payload]`), then the end marker: the same framing
with the sequence field eight 0xFF bytes and an empty payload. Malformed requests are logged
and dropped. The ROUTER has no send high-water mark, so a long replay is never cut short.

Sockets live on this transport's own context, closed and terminated by `stop()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import zmq
import zmq.asyncio

from switchyard.common.ports import PortRange, tcp_endpoint_port, zmq_bind
from switchyard.mock_engine.kv_events import KvEventPublisher

logger = logging.getLogger(__name__)

END_SEQ = b"\xff" * 8  # -1 as a signed 64-bit big-endian int


def publisher_binds(endpoint: str) -> bool:
    """The engines' heuristic (SGLang's and vLLM's ZmqEventPublisher): bind a wildcard or a
    local transport, connect anything that names a host (0.0.0.0 included). Port 0 binds too
    (the mock's free-port convention; no publisher can connect to port 0)."""
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        return True
    parsed = tcp_endpoint_port(endpoint)
    return parsed is not None and parsed[1] == 0


def rank_endpoint(endpoint: str, rank: int) -> str:
    """The engines' offset_endpoint_port: tcp port + rank, inproc name + `_dp{rank}`; a
    wildcard port (`*`, 0) stays as it is (each rank binds a port of its own)."""
    if not rank:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        address, colon, port = endpoint.rpartition(":")
        if colon and port.isdigit() and int(port):
            return f"{address}:{int(port) + rank}"
    return endpoint


def follow_rank0(endpoint: str, bound: str | None) -> str:
    """The base endpoint ranks > 0 count from: `endpoint` itself, or, when its port is 0, the
    same host with the port rank 0 bound (so rank r is still base + r, as consumers expect)."""
    parsed = tcp_endpoint_port(endpoint)
    if parsed is None or parsed[1] != 0 or bound is None:
        return endpoint
    resolved = tcp_endpoint_port(bound)
    if resolved is None:
        return endpoint
    return f"{endpoint.rpartition(':')[0]}:{resolved[1]}"


class KvZmqTransport:
    def __init__(
        self,
        publisher: KvEventPublisher,
        *,
        endpoint: str | None,
        replay_endpoint: str | None,
        topic: str = "",
        replay_topic_frame: bool = False,
        skip_seqs: frozenset[int] = frozenset(),
        hwm: int = 100_000,
        ports: PortRange | None = None,
        bind: bool | None = None,
    ) -> None:
        self._publisher = publisher
        self._bind = bind  # the PUB binds (True) or connects (False); None: publisher_binds
        self._ports = ports  # where a port 0 in an endpoint is searched
        self._endpoint = endpoint
        self._replay_endpoint = replay_endpoint
        self._topic = topic.encode("utf-8")
        self._replay_topic_frame = replay_topic_frame
        self._skip_seqs = skip_seqs
        self._hwm = hwm
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.bound_endpoint: str | None = None  # what the PUB socket bound (a `*` port resolved)
        self.bound_replay_endpoint: str | None = None
        self.connects = False  # the PUB connected to a subscriber that binds

    def start(self) -> None:
        """Bind the sockets (OSError when an endpoint cannot be bound) and serve replays."""
        if self._endpoint is None and self._replay_endpoint is None:
            return
        ctx = zmq.asyncio.Context()
        self._ctx = ctx
        try:
            if self._endpoint is not None:
                # A plain socket on the same context: a PUB send never blocks, so the batch
                # callback sends it synchronously, in sequence order.
                pub: zmq.Socket[bytes] = zmq.Context.shadow(ctx.underlying).socket(zmq.PUB)
                self._pub = pub
                pub.setsockopt(zmq.LINGER, 0)
                pub.setsockopt(zmq.SNDHWM, self._hwm)
                binds = self._bind if self._bind is not None else publisher_binds(self._endpoint)
                if binds:
                    zmq_bind(pub, self._endpoint, self._ports)
                    self.bound_endpoint = _last_endpoint(pub)
                else:
                    pub.connect(self._endpoint)
                    self.connects = True
                    self.bound_endpoint = self._endpoint
            if self._replay_endpoint is not None:
                router = ctx.socket(zmq.ROUTER)
                self._router = router
                router.setsockopt(zmq.LINGER, 0)
                router.setsockopt(zmq.SNDHWM, 0)
                zmq_bind(router, self._replay_endpoint, self._ports)
                self.bound_replay_endpoint = _last_endpoint(router)
        except (zmq.ZMQError, OSError) as exc:
            self._close_sockets()
            raise OSError(f"cannot bind the KV event sockets: {exc}") from exc
        if self._pub is not None:
            self._publisher.add_listener(self._send)
        if self._router is not None:
            self._replay_task = asyncio.get_running_loop().create_task(
                self._serve_replay(self._router), name="kv-replay"
            )
        logger.info(
            "KV events on zmq pub=%s replay=%s", self.bound_endpoint, self.bound_replay_endpoint
        )

    async def stop(self) -> None:
        self._publisher.remove_listener(self._send)
        task, self._replay_task = self._replay_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.term()

    def _send(self, seq: int, payload: bytes) -> None:
        if seq in self._skip_seqs:
            logger.debug("KV event batch seq=%d withheld from the PUB socket (--kv-skip-seq)", seq)
            return
        if self._pub is not None:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK)

    def _reply(self, identity: bytes, seq_bytes: bytes, payload: bytes) -> list[bytes]:
        if self._replay_topic_frame:
            return [identity, b"", self._topic, seq_bytes, payload]
        return [identity, b"", seq_bytes, payload]

    async def _serve_replay(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                logger.warning("invalid KV replay request: %d frames", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            batches = self._publisher.replay(start)
            logger.debug("KV replay from seq=%d: %d batches", start, len(batches))
            for seq, payload in batches:
                await router.send_multipart(self._reply(identity, seq.to_bytes(8, "big"), payload))
            await router.send_multipart(self._reply(identity, END_SEQ, b""))


def _last_endpoint(sock: zmq.Socket[Any]) -> str:
    value = sock.getsockopt(zmq.LAST_ENDPOINT)
    return value.decode() if isinstance(value, bytes) else str(value)
