"""`switchyard kv-proxy`: one address for engines that connect their KV-event publisher, fanned
out to every router replica.

An engine's publisher names one endpoint. When engines connect (rather than bind), several
router replicas cannot all be that endpoint, so the proxy is: an XSUB bound at the frontend
(engines connect their PUB sockets there, with a topic naming the engine) forwarding to an
XPUB bound at the backend (each router connects with `--kv-events-proxy`). One pair per
data-parallel rank port (base + r on both sides), since rank r connects to base + r.

Why every replica's index converges: the proxy forwards each message unchanged (topic,
sequence, payload) to every connected router, so each replica sees the same per-publisher
sequence. A replica that joins late, or loses messages (a full XPUB queue drops them), sees a
late join or a gap and fills it from the engine's own replay ROUTER (engines bind it
whatever their publisher does), exactly as in connect mode; a replica that restarts replays
the engine's buffer. The proxy keeps no state: restarting it is a gap for every stream.

A connecting engine's first batches are dropped until its connection is made and the
subscription reached it, so when an engine connects to a frontend the proxy forwards a notice
to every router (topic `PROXY_NOTICE_TOPIC`, sequence 0, payload the engine's host, learned
from the socket monitor): each router's streams of that host catch up from their replay.

    switchyard kv-proxy --frontend tcp://*:5557 --backend tcp://*:5567 [--ranks 2]

A port 0 binds a free port (searched in --port-range) for rank 0, rank r then binds that
port + r; --ready-file reports the bound `frontends` and `backends`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from types import FrameType

import zmq

from switchyard.common.argtypes import whole_number
from switchyard.common.endpoints import zmq_endpoint
from switchyard.common.logs import add_logging_arguments, setup_logging
from switchyard.common.ports import PortRange, add_port_arguments, write_ready_file, zmq_bind
from switchyard.router.kv.listener import PROXY_NOTICE_TOPIC, peer_host
from switchyard.router.kv.subscriber import rank_endpoint

log = logging.getLogger(__name__)

QUEUE = 100_000  # messages queued per router before the XPUB drops (a gap: replayed)


class KvEventProxy:
    """XSUB/XPUB pairs, each forwarded by libzmq's own proxy loop in a thread."""

    def __init__(
        self, frontend: str, backend: str, ranks: int = 1, ports: PortRange | None = None
    ) -> None:
        if ranks < 1:
            raise ValueError(f"ranks must be at least 1, got {ranks}")
        self.frontend = frontend
        self.backend = backend
        self.ranks = ranks
        self._ports = ports  # where a port 0 is searched
        self._context = zmq.Context()
        self._threads: list[threading.Thread] = []
        self._noticers: list[threading.Thread] = []
        self._controls: list[zmq.Socket[bytes]] = []
        self.frontends: list[str] = []  # bound endpoints (ports resolved)
        self.backends: list[str] = []

    def start(self) -> None:
        ctx = self._context
        for rank in range(self.ranks):
            xsub = ctx.socket(zmq.XSUB)
            xpub = ctx.socket(zmq.XPUB)
            for sock in (xsub, xpub):
                sock.setsockopt(zmq.LINGER, 0)
            xsub.setsockopt(zmq.RCVHWM, QUEUE)
            xpub.setsockopt(zmq.SNDHWM, QUEUE)
            try:
                front = zmq_bind(xsub, rank_endpoint(self.frontend, rank), self._ports)
                back = zmq_bind(xpub, rank_endpoint(self.backend, rank), self._ports)
            except (zmq.ZMQError, OSError):
                xsub.close(linger=0)
                xpub.close(linger=0)
                raise
            if rank == 0:  # a port 0 resolved: the other ranks follow the bound ports
                self.frontend, self.backend = front, back
            self.frontends.append(front)
            self.backends.append(back)
            notices = f"inproc://kv-proxy-notices-{id(self)}-{rank}"
            xsub.bind(notices)
            monitor = xsub.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
            stop_address = f"inproc://kv-proxy-notice-stop-{id(self)}-{rank}"
            stop = ctx.socket(zmq.PAIR)
            stop.bind(stop_address)
            stop_peer = ctx.socket(zmq.PAIR)
            stop_peer.connect(stop_address)
            notice_pub = ctx.socket(zmq.PUB)
            notice_pub.setsockopt(zmq.LINGER, 0)
            notice_pub.connect(notices)
            self._controls.append(stop)
            noticer = threading.Thread(
                target=_notify,
                args=(monitor, notice_pub, stop_peer),
                name=f"kv-proxy-notices-{rank}",
                daemon=True,
            )
            noticer.start()
            self._noticers.append(noticer)
            control_address = f"inproc://kv-proxy-control-{id(self)}-{rank}"
            control = ctx.socket(zmq.PAIR)
            control.bind(control_address)
            peer = ctx.socket(zmq.PAIR)
            peer.connect(control_address)
            self._controls.append(control)
            thread = threading.Thread(
                target=_forward, args=(xsub, xpub, peer), name=f"kv-proxy-{rank}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
            log.info(
                "kv proxy rank=%d frontend=%s backend=%s",
                rank,
                self.frontends[-1],
                self.backends[-1],
            )

    def stop(self) -> None:
        for control in self._controls:
            control.send(b"TERMINATE")
        for thread in self._threads + self._noticers:
            thread.join(timeout=5)
        for control in self._controls:
            control.close(linger=0)
        self._controls.clear()
        self._threads.clear()
        self._noticers.clear()
        self._context.term()


def _forward(xsub: zmq.Socket[bytes], xpub: zmq.Socket[bytes], control: zmq.Socket[bytes]) -> None:
    try:
        zmq.proxy_steerable(xsub, xpub, None, control)
    except zmq.ContextTerminated:  # pragma: no cover - stop() terminates after TERMINATE
        pass
    finally:
        for sock in (xsub, xpub, control):
            sock.close(linger=0)


def _notify(monitor: zmq.Socket[bytes], pub: zmq.Socket[bytes], stop: zmq.Socket[bytes]) -> None:
    """Forward a notice naming the host of each engine that connects to the frontend."""
    from zmq.utils.monitor import parse_monitor_message

    poller = zmq.Poller()
    poller.register(monitor, zmq.POLLIN)
    poller.register(stop, zmq.POLLIN)
    peers: list[str | None] = []
    try:
        while True:
            ready = dict(poller.poll())
            if stop in ready:
                return
            event = parse_monitor_message(monitor.recv_multipart())
            if event["event"] == zmq.EVENT_ACCEPTED:
                peers.append(peer_host(int(event["value"])))
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                for host in peers or [None]:
                    log.info("kv proxy: a publisher connected from %s", host or "an unknown host")
                    pub.send_multipart([PROXY_NOTICE_TOPIC, bytes(8), (host or "").encode()])
                peers = []
    finally:
        for sock in (monitor, pub, stop):
            sock.close(linger=0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--frontend",
        required=True,
        type=zmq_endpoint,
        help="where engines connect their KV-event PUB sockets, e.g. tcp://*:5557",
    )
    parser.add_argument(
        "--backend",
        required=True,
        type=zmq_endpoint,
        help="where routers connect (router --kv-events-proxy), e.g. tcp://*:5567",
    )
    parser.add_argument(
        "--ranks",
        type=whole_number(1),
        default=1,
        help="data-parallel ranks: one frontend/backend pair per rank at base port + rank",
    )
    add_port_arguments(parser)
    add_logging_arguments(parser)


def run(args: argparse.Namespace) -> int:
    setup_logging("kv-proxy", args.log_level, args.log_format)
    proxy = KvEventProxy(args.frontend, args.backend, args.ranks, args.port_range)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        proxy.start()
    except (zmq.ZMQError, OSError) as exc:
        log.error("kv-proxy: cannot bind: %s", exc)
        proxy.stop()
        return 2
    write_ready_file(args.ready_file, {"frontends": proxy.frontends, "backends": proxy.backends})
    log.info("kv proxy ready")
    stop.wait()
    proxy.stop()
    return 0
