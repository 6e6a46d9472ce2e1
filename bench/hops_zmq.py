"""ZMQ between two processes on one host: a DEALER client and a ROUTER server, per variant.

A variant is a transport (tcp:// on loopback or ipc://), a socket API and a number of ZMQ I/O
threads (in both processes): `loop` is the project's LoopSocket (libs/common/messaging.py, the
socket's FD on the event loop, non-blocking calls into pyzmq's Cython socket), `sugar` the
same through pyzmq's Python layer (LoopSocket before), `deferred` LoopSocket draining after
every send on the next loop iteration (as it did before it read the events at once),
`asyncio` is zmq.asyncio (a future per recv). Both ends run on uvloop and use the same
variant. Patterns:

  ping    the client keeps `concurrency` requests in flight; the server echoes each one
          (one message each way: the route round trip's shape)
  stream  the client keeps `concurrency` streams in flight; for each request the server sends
          `replies` small messages, one per loop iteration (the dispatcher's token replies)

The client measures its own CPU (getrusage) and asks the server for its own, in band, before
and after the measured run; it reports both per message, and the round-trip (ping) or stream
(stream) latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import uvloop
import zmq
import zmq.asyncio

from switchyard.common.messaging import LoopSocket, new_socket

PING, STREAM, MARK = b"p", b"s", b"m"
ID = struct.Struct(">Q")
LAST = b"\x01"
MORE = b"\x00"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def usage() -> tuple[float, int]:
    """(CPU seconds, voluntary context switches) of every thread of this process so far."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_nvcsw


class SugarLoopSocket(LoopSocket):
    """LoopSocket as it was before it called pyzmq's Cython socket directly: recv_multipart,
    send_multipart and the EVENTS attribute of pyzmq's Python layer."""

    def _drain(self) -> None:
        self._drain_soon = False
        sock, handle = self.sock, self._on_message
        recv = sock.recv_multipart if self._multipart else sock.recv
        while not self._closed and sock.EVENTS & zmq.POLLIN:  # type: ignore[operator]
            try:
                message = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                handle(message)
            except Exception:
                pass

    def _send_now(self, multipart: bool, data: Any) -> None:
        if multipart:
            self.sock.send_multipart(data, zmq.NOBLOCK)
        else:
            self.sock.send(data, zmq.NOBLOCK)


class DeferredLoopSocket(LoopSocket):
    """LoopSocket as it was before it read the socket's events right after a send: every send
    scheduled a drain on the next loop iteration."""

    def _sent(self) -> None:
        if not self._drain_soon:
            self._drain_soon = True
            self._loop.call_soon(self._drain)


_LOOP_SOCKETS: dict[str, type[LoopSocket]] = {
    "loop": LoopSocket,
    "loop-sugar": SugarLoopSocket,
    "loop-deferred": DeferredLoopSocket,
}


class Io:
    """The two socket APIs behind one shape: on_message(frames) callbacks, send(frames)."""

    def __init__(
        self, api: str, io_threads: int, kind: int, on_message: Callable[[list[bytes]], None]
    ):
        self.api = api
        self.on_message = on_message
        if api != "asyncio":
            self.ctx: Any = zmq.Context(io_threads)
            self.sock = new_socket(self.ctx, kind, sync=True)
        else:
            self.ctx = zmq.asyncio.Context(io_threads)
            self.sock = new_socket(self.ctx, kind)
        self.loop_sock: LoopSocket | None = None
        self.reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.api != "asyncio":
            kind = _LOOP_SOCKETS[self.api]
            self.loop_sock = kind(self.sock, self.on_message, multipart=True)
        else:
            self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        recv, handle = self.sock.recv_multipart, self.on_message
        while True:
            handle(await recv())

    async def send(self, frames: list[bytes]) -> None:
        if self.loop_sock is not None:
            self.loop_sock.send_multipart(frames)
        else:
            await self.sock.send_multipart(frames)

    def send_now(self, frames: list[bytes]) -> None:
        """Send from a callback without waiting (zmq.asyncio sends at once when it can)."""
        if self.loop_sock is not None:
            self.loop_sock.send_multipart(frames)
        else:
            self.sock.send_multipart(frames)

    def close(self) -> None:
        if self.loop_sock is not None:
            self.loop_sock.close()
        else:
            if self.reader is not None:
                self.reader.cancel()
            self.sock.close(linger=0)
        self.ctx.term()


async def serve(args: argparse.Namespace) -> None:
    tasks: set[asyncio.Task[None]] = set()
    payload = b"x" * args.size
    replies = args.replies

    async def stream(peer: bytes, rid: bytes) -> None:
        for i in range(replies):
            await io.send([peer, rid + (LAST if i == replies - 1 else MORE) + payload])
            await asyncio.sleep(0)

    def on_message(frames: list[bytes]) -> None:
        peer, body = frames
        kind = body[:1]
        if kind == PING:
            io.send_now([peer, body[1:]])
        elif kind == STREAM:
            spawn(stream(peer, body[1:9]))
        elif kind == MARK:
            spawn(io.send([peer, b"m" + json.dumps(usage()).encode()]))

    def spawn(coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    io = Io(args.api, args.io_threads, zmq.ROUTER, on_message)
    io.sock.bind(args.endpoint)
    io.start()
    print("ready", flush=True)
    # Serve until stdin closes (the parent ends the run).
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(sys.stdin.fileno(), lambda: done.done() or done.set_result(None))
    await done
    io.close()


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    waiters: dict[bytes, asyncio.Future[None]] = {}
    marks: list[asyncio.Future[list[float]]] = []
    payload = b"x" * args.size
    received = 0

    def on_message(frames: list[bytes]) -> None:
        nonlocal received
        body = frames[0]
        if body[:1] == b"m":
            marks.pop(0).set_result(json.loads(body[1:]))
            return
        received += 1
        if args.pattern == "ping" or body[8:9] == LAST:
            future = waiters.pop(body[:8], None)
            if future is not None:
                future.set_result(None)

    io = Io(args.api, args.io_threads, zmq.DEALER, on_message)
    io.sock.connect(args.endpoint)
    io.start()
    loop = asyncio.get_running_loop()
    kind = PING if args.pattern == "ping" else STREAM
    ids = iter(range(1 << 62))
    latencies: list[float] = []

    async def one() -> None:
        rid = ID.pack(next(ids))
        future = loop.create_future()
        waiters[rid] = future
        start = time.perf_counter()
        await io.send([kind + rid + payload])
        await future
        latencies.append(time.perf_counter() - start)

    async def worker(count: int, deadline: float = 0.0) -> None:
        if deadline:
            while time.perf_counter() < deadline:
                await one()
        else:
            for _ in range(count):
                await one()

    async def mark() -> list[float]:
        future: asyncio.Future[list[float]] = loop.create_future()
        marks.append(future)
        await io.send([MARK])
        return await asyncio.wait_for(future, 30)

    await asyncio.gather(*(worker(50) for _ in range(args.concurrency)))
    latencies.clear()
    received = 0
    from hops import wait_go

    await wait_go()
    server0 = await mark()
    (cpu0, sleeps0), wall0 = usage(), time.perf_counter()
    deadline = wall0 + args.seconds
    await asyncio.gather(*(worker(0, deadline) for _ in range(args.concurrency)))
    (cpu1, sleeps1), wall = usage(), time.perf_counter() - wall0
    server1 = await mark()
    io.close()
    latencies.sort()
    messages = len(latencies) + received  # requests sent + replies received
    return {
        "client_cpu_s": cpu1 - cpu0,
        "server_cpu_s": server1[0] - server0[0],
        "wakeups": sleeps1 - sleeps0 + server1[1] - server0[1],
        "wall_s": wall,
        "requests": len(latencies),
        "messages": messages,
        "lat_p50": latencies[len(latencies) // 2],
        "lat_p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


VARIANTS = {
    "tcp-loop-1": ("tcp", "loop", 1),
    "tcp-sugar-1": ("tcp", "loop-sugar", 1),
    "tcp-deferred-1": ("tcp", "loop-deferred", 1),
    "ipc-loop-1": ("ipc", "loop", 1),
    "tcp-loop-2": ("tcp", "loop", 2),
    "ipc-loop-2": ("ipc", "loop", 2),
    "tcp-asyncio-1": ("tcp", "asyncio", 1),
    "ipc-asyncio-1": ("ipc", "asyncio", 1),
}
DEFAULT_VARIANTS = "tcp-loop-1,tcp-sugar-1,ipc-loop-1,tcp-loop-2,tcp-asyncio-1"
QUICK_VARIANTS = "tcp-loop-1,ipc-loop-1"


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["server", "client"])
    parser.add_argument("--endpoint", required=True)
    apis = ["loop", "loop-sugar", "loop-deferred", "asyncio"]
    parser.add_argument("--api", choices=apis, required=True)
    parser.add_argument("--io-threads", type=int, default=1)
    parser.add_argument("--pattern", choices=["ping", "stream"], default="ping")
    parser.add_argument("--replies", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.role == "server":
        uvloop.run(serve(args))
    else:
        print(json.dumps(uvloop.run(drive(args))))


class _Pair:
    """A server child, then a client child (a ChildJob) against it."""

    def __init__(self, variant: str, pattern: str, concurrency: int, replies: int,
                 seconds: float, tmp: str) -> None:  # fmt: skip
        import subprocess

        from hops import HERE, ChildJob

        from switchyard.common.ports import free_port

        transport, api, threads = VARIANTS[variant]
        if transport == "tcp":
            endpoint = f"tcp://127.0.0.1:{free_port()}"
        else:
            endpoint = f"ipc://{tmp}/{variant}-{time.monotonic_ns()}.sock"
        common = ["--endpoint", endpoint, "--api", api, "--io-threads", str(threads)]
        common += ["--pattern", pattern, "--replies", str(replies)]
        self.server = subprocess.Popen(
            [sys.executable, "hops_zmq.py", "server", *common],
            cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.server.stdout is not None
        if self.server.stdout.readline().strip() != "ready":
            self._stop()
            raise RuntimeError(f"zmq server {variant} did not start")
        argv = ["hops_zmq.py", "client", *common, "--concurrency", str(concurrency)]
        self.client = ChildJob(argv + ["--seconds", str(seconds)])
        self.warmed = self.client.warmed
        self.go = self.client.go

    def _stop(self) -> None:
        import subprocess

        assert self.server.stdin is not None
        self.server.stdin.close()
        try:
            self.server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()

    def result(self) -> dict[str, float]:
        try:
            r = self.client.output()
        finally:
            self._stop()
        msgs = r["messages"]
        return {
            "cpu_us_per_msg": (r["client_cpu_s"] + r["server_cpu_s"]) / msgs * 1e6,
            "client_us_per_msg": r["client_cpu_s"] / msgs * 1e6,
            "server_us_per_msg": r["server_cpu_s"] / msgs * 1e6,
            "wakeups_per_msg": r["wakeups"] / msgs,
            "lat_p50_us": r["lat_p50"] * 1e6,
            "lat_p99_us": r["lat_p99"] * 1e6,
            "msg_s": msgs / r["wall_s"],
        }


def run(args: argparse.Namespace, progress: Callable[[str], None]) -> tuple[list[Any], list[str]]:
    from hops import Comparison, run_pairs

    quick = args.quick
    variants = (args.variants or (QUICK_VARIANTS if quick else DEFAULT_VARIANTS)).split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown ZMQ variants: {unknown}; known: {sorted(VARIANTS)}")
    concurrencies = [int(c) for c in (args.concurrency or ("4" if quick else "1,64")).split(",")]
    replies = int((args.tokens or "16").split(",")[0])
    rounds = args.rounds or (1 if quick else 3)
    seconds = args.seconds or (0.5 if quick else 4.0)
    comparisons = []
    tmp = tempfile.mkdtemp(prefix="hops-zmq-")
    for pattern in ("ping", "stream"):
        for concurrency in concurrencies:
            point = f"{pattern} c={concurrency}"
            comparison = Comparison(
                "zmq",
                point + (f" replies={replies}" if pattern == "stream" else ""),
                variants[0],
                ["cpu_us_per_msg", "client_us_per_msg", "server_us_per_msg", "wakeups_per_msg",
                 "lat_p50_us", "lat_p99_us", "msg_s"],
            )  # fmt: skip

            def launch(variant: str, p: str = pattern, c: int = concurrency) -> _Pair:
                return _Pair(variant, p, c, replies, seconds, tmp)

            comparisons.append(run_pairs(comparison, variants, rounds, launch, progress))
    notes = [
        "CPU of both processes (client + server) per message sent or received by the client; "
        "64-byte payloads. Variant = transport-api-io threads (`loop`: LoopSocket, "
        "`asyncio`: zmq.asyncio).",
        "",
    ]
    return comparisons, notes


if __name__ == "__main__":
    child_main(sys.argv[1:])
