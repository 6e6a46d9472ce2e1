"""What one Python process costs per message when messages come one at a time: the floor under
each of the stack's two per-token hops at concurrency 1.

At concurrency 1 a streamed token arrives alone, every ITL (5 ms with the mock's defaults), so
every token wakes the dispatcher and the preprocessor from their sleep; nothing batches. A
source process sends one small message every `--gap-ms`; a relay process on uvloop passes each
one on to a sink process, and measures its own CPU (all its threads: the loop's and ZMQ's I/O
thread) and its wake-ups (voluntary context switches) per message. Variants, by what the relay
reads and writes:

  tcp-tcp   a socket in, a socket out (asyncio Protocol): the bare cost of a Python process
            waking per message
  tcp-zmq   a socket in, a ZMQ DEALER out through LoopSocket: the dispatcher's shape (an engine
            stream in, a token message to the preprocessor out) without HTTP/2 and protobuf
  zmq-tcp   a ZMQ ROUTER in through LoopSocket, a socket out: the preprocessor's shape (token
            messages in, SSE bytes to the client out) without detokenizing and framing

Read against the stack's per-token cost at concurrency 1 (`bench/load.py --with-smg
--max-tokens 256`: the dispatcher's and the preprocessor's CPU per request over the tokens) and
smg's (one process for the whole path).

    python bench/paced_hop.py                    # every variant, 2000 messages 5 ms apart
    python bench/paced_hop.py --messages 200 --gap-ms 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import socket
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import uvloop
import zmq
from procstat import wakeups

from switchyard.common.messaging import LoopSocket, new_socket

VARIANTS = ("tcp-tcp", "tcp-zmq", "zmq-tcp")
WARM = 50  # messages before the measured window
PAYLOAD = b"x" * 64


def _usage() -> tuple[float, int]:
    """CPU seconds of this process (every thread) and voluntary context switches of every
    thread: each is a sleep that ended in a wake-up."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, wakeups(os.getpid())


# --- the sink: reads whatever comes, as fast as it comes (blocking, not measured) ----------


def _sink(kind: str, ready: Connection) -> None:
    if kind == "zmq":
        ctx = zmq.Context()
        sock = new_socket(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:0")
        ready.send(sock.getsockopt(zmq.LAST_ENDPOINT).decode())
        while sock.recv_multipart()[-1] != b"":
            pass
        return
    server = socket.create_server(("127.0.0.1", 0))
    ready.send(f"127.0.0.1:{server.getsockname()[1]}")
    conn, _ = server.accept()
    while conn.recv(65536):
        pass


# --- the source: one message every gap (blocking, not measured) -----------------------------


def _source(kind: str, address: str, count: int, gap: float) -> None:
    if kind == "zmq":
        ctx = zmq.Context()
        sock = new_socket(ctx, zmq.DEALER, connect=[address])
        send = sock.send
    else:
        host, port = address.rsplit(":", 1)
        conn = socket.create_connection((host, int(port)))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        send = conn.sendall
    time.sleep(0.3)  # the relay's reader is up
    due = time.monotonic()
    for _ in range(count):
        send(PAYLOAD)
        due += gap
        time.sleep(max(0.0, due - time.monotonic()))
    send(b"")  # the end (a zero-length ZMQ frame; a TCP close)
    if kind != "zmq":
        conn.close()


# --- the relay: the measured process --------------------------------------------------------


class _Counter:
    """Counts messages; takes the usage at the window's start and end."""

    def __init__(self, count: int, done: asyncio.Future[dict[str, float]]) -> None:
        self.seen = 0
        self.count = count
        self.done = done
        self.start: tuple[float, int] = (0.0, 0)

    def tick(self) -> None:
        self.seen += 1
        if self.seen == WARM:
            self.start = _usage()
        elif self.seen == WARM + self.count and not self.done.done():
            cpu, switches = _usage()
            self.done.set_result(
                {
                    "cpu_us_per_msg": (cpu - self.start[0]) / self.count * 1e6,
                    "wakeups_per_msg": (switches - self.start[1]) / self.count,
                }
            )


async def _relay(variant: str, sink: str, count: int, ready: Connection) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[dict[str, float]] = loop.create_future()
    counter = _Counter(count, done)
    ctx = zmq.Context()
    inward, outward = variant.split("-")

    if outward == "zmq":
        out_sock = new_socket(ctx, zmq.DEALER, sync=True, connect=[sink])
        zmq_out = LoopSocket(out_sock, lambda _m: None, multipart=False)
        write = zmq_out.send
    else:
        host, port = sink.rsplit(":", 1)
        out_transport, _ = await loop.create_connection(asyncio.Protocol, host, int(port))
        write = out_transport.write

    if inward == "zmq":
        in_sock = new_socket(ctx, zmq.ROUTER, sync=True, bind="tcp://127.0.0.1:0")

        def on_message(frames: list[bytes]) -> None:
            if frames[-1]:
                write(frames[-1])
                counter.tick()

        LoopSocket(in_sock, on_message, multipart=True)
        ready.send(in_sock.getsockopt(zmq.LAST_ENDPOINT).decode())
    else:

        class In(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                # A message is 64 bytes; a read holding two (rare at these gaps) counts two.
                for _ in range(max(1, len(data) // len(PAYLOAD))):
                    counter.tick()
                write(data)

        server = await loop.create_server(In, "127.0.0.1", 0)
        ready.send(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    return await asyncio.wait_for(done, timeout=count * 0.1 + 60)


def _relay_main(variant: str, sink: str, count: int, ready: Connection, out: Connection) -> None:
    out.send(uvloop.run(_relay(variant, sink, count, ready)))


def measure(variant: str, count: int, gap: float) -> dict[str, float]:
    ctx = mp.get_context("fork")  # before any loop or ZMQ context exists in this process
    inward, outward = variant.split("-")
    sink_ready, sink_addr = ctx.Pipe()
    relay_ready, relay_addr = ctx.Pipe()
    result_out, result_in = ctx.Pipe()
    sink = ctx.Process(target=_sink, args=(outward, sink_ready), daemon=True)
    sink.start()
    sink_at = sink_addr.recv()
    relay = ctx.Process(
        target=_relay_main, args=(variant, sink_at, count, relay_ready, result_in), daemon=True
    )
    relay.start()
    source = ctx.Process(
        target=_source, args=(inward, relay_addr.recv(), WARM + count, gap), daemon=True
    )
    source.start()
    try:
        if not result_out.poll(count * gap + 120):
            raise RuntimeError(f"{variant}: no result from the relay")
        return dict(result_out.recv())
    finally:
        for proc in (source, relay, sink):
            proc.kill()
            proc.join(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--messages", type=int, default=2000, help="measured, per variant")
    parser.add_argument("--gap-ms", type=float, default=5.0, help="between two messages")
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    results: dict[str, Any] = {v: measure(v, args.messages, args.gap_ms / 1000) for v in variants}
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"{args.messages} messages, {args.gap_ms:g} ms apart, per message of the relay:\n")
    print("| variant | CPU µs | wake-ups |\n|---|---|---|")
    for variant, got in results.items():
        print(f"| {variant} | {got['cpu_us_per_msg']:.1f} | {got['wakeups_per_msg']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
