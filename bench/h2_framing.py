"""HTTP/2 framing per token: the `h2` library against our frame reader (C and pure Python).

The same recorded bytes, as an SGLang engine writes its replies to Generate calls (the server's
SETTINGS, then per stream a response HEADERS, one DATA frame per token holding one gRPC
message: a GenerateResponse with a one-token `chunk`, and the trailers), go through:

- `h2`: h2.connection.H2Connection, client side, its streams opened with send_headers and its
  receive windows as large as ours; every read through `receive_data` into events, each
  DataReceived acknowledged (flow control) and `data_to_send()` taken, as a client must;
- `own-py`: our frame reader in pure Python (frames.PyFrameReader): every read through `feed`
  into events (kind, flags, stream, payload), each DATA's length counted (what
  http2.Http2Connection does for flow control before it reads the gRPC messages);
- `own-c`: the same with the C reader (frames.FrameReader, _frames.c);
- `own-c-relay`: what the dispatcher runs today: the streams relayed (FrameReader.relay), every
  token's gRPC message read and written into the ReplyBatch as the msgpack TokenDelta, the
  batch taken once per read. This does more than framing (the protobuf read and the msgpack
  write are in it), so it is the cost to beat.

Each read carries one frame per stream, as an engine's decode step does: `--streams 1` is
concurrency 1 (a read per token), `--streams 32` a batch of 32. The count is, under callgrind
(instructions: the same on a busy machine as on an idle one), the difference of two runs of
different lengths over the tokens between them, less the same difference of a run that only
builds the bytes (`floor`): start-up, imports, per-stream work and the recording cancel out.
`--time` measures nanoseconds per token instead (the fastest of --repeats in-process runs:
noisy on a shared machine).

    python bench/h2_framing.py                      # instructions, streams 1 and 32
    python bench/h2_framing.py --time               # ns per token, no valgrind
    python bench/h2_framing.py --modes h2,own-c --streams 32

Needs the bench extra (h2 is a bench dependency only) and valgrind for the default count.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness import callgrind_instructions

MODES = ("h2", "own-py", "own-c", "own-c-relay")
RID = "chatcmpl-" + "0" * 32


def record(streams: int, tokens: int) -> tuple[bytes, list[bytes], bytes]:
    """(the server's SETTINGS and the response HEADERS, one read per token: a DATA frame per
    stream, the trailers) of `streams` streams (ids 1, 3, ...) of `tokens` tokens each."""
    import hpack
    from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

    from switchyard.common.engines import http2

    encoder = hpack.Encoder()
    ids = [2 * k + 1 for k in range(streams)]

    def headers(stream: int, block: list[tuple[str, str]], end: bool) -> bytes:
        flags = http2.END_HEADERS | (http2.END_STREAM if end else 0)
        return http2.frame(http2.HEADERS, flags, stream, encoder.encode(block))

    def data(stream: int, message: bytes) -> bytes:
        grpc = b"\x00" + len(message).to_bytes(4, "big") + message
        return http2.frame(http2.DATA, 0, stream, grpc)

    ok = [(":status", "200"), ("content-type", "application/grpc")]
    head = http2.frame(http2.SETTINGS, 0, 0) + b"".join(headers(s, ok, False) for s in ids)
    reads = []
    for t in range(tokens):
        chunk = pb.GenerateStreamChunk(token_ids=[1000 + t], prompt_tokens=32, completion_tokens=t)
        message = pb.GenerateResponse(request_id=RID, chunk=chunk).SerializeToString()
        reads.append(b"".join(data(s, message) for s in ids))
    tail = b"".join(headers(s, [("grpc-status", "0")], True) for s in ids)
    return head, reads, tail


def runner(mode: str, streams: int) -> Callable[[bytes, list[bytes], bytes], int]:
    """A function that feeds a recording through `mode`'s framing on a fresh connection and
    returns what it saw (DATA frames, or tokens relayed)."""
    if mode == "h2":
        return _h2_runner(streams)
    from switchyard.common.engines import frames, http2

    if mode == "own-py":
        reader_type: type = frames.PyFrameReader
    else:
        if not frames.NATIVE:
            raise SystemExit("the C frame reader is not built (or SWITCHYARD_NATIVE=0)")
        reader_type = frames.FrameReader
    relay = mode == "own-c-relay"
    data_kind = frames.DATA

    def run(head: bytes, reads: list[bytes], tail: bytes) -> int:
        reader = reader_type(http2.MAX_MESSAGE, http2.REFILL)
        batch = frames.ReplyBatch()
        seen = received = 0
        if relay:
            for k in range(streams):
                reader.relay(2 * k + 1, batch, RID, frames.SGLANG)
        for data in (head, *reads, tail):
            event = reader.feed(data)
            while event is not None:
                if event[0] == data_kind:
                    received += len(event[3])
                    seen += 1
                event = reader.feed(b"")
            if relay:
                batch.take()
        return seen + reader.relayed

    return run


def _h2_runner(streams: int) -> Callable[[bytes, list[bytes], bytes], int]:
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    data_received = h2.events.DataReceived
    request = [(":method", "POST"), (":scheme", "http"), (":path", "/sglang.Scheduler/Generate")]
    request += [(":authority", "engine"), ("content-type", "application/grpc"), ("te", "trailers")]

    def run(head: bytes, reads: list[bytes], tail: bytes) -> int:
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        conn = h2.connection.H2Connection(config)
        conn.initiate_connection()
        # Receive windows as ours (http2.py): nothing waits on a WINDOW_UPDATE in the run.
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
        conn.increment_flow_control_window(2**30)
        for k in range(streams):
            conn.send_headers(2 * k + 1, request, end_stream=True)
        conn.data_to_send()
        seen = 0
        for data in (head, *reads, tail):
            for event in conn.receive_data(data):
                if type(event) is data_received:
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    seen += 1
            conn.data_to_send()
        return seen

    return run


def _child(mode: str, streams: int, tokens: int) -> None:
    """One run under callgrind: record, then (unless `floor`) feed the recording."""
    run = runner(mode, streams) if mode != "floor" else None
    head, reads, tail = record(streams, tokens)
    if run is not None:
        seen = run(head, reads, tail)
        assert seen >= streams * tokens, (mode, seen)


def instructions(python: str, mode: str, streams: int, tokens: int) -> int:
    argv = [python, str(Path(__file__)), "--child", mode, str(streams), str(tokens)]
    return callgrind_instructions(argv, "h2-framing-")


def per_token_instructions(args: argparse.Namespace, modes: list[str], streams: int) -> dict:
    short, long = 16, 16 + args.tokens
    base = args.python

    def diff(mode: str) -> int:
        return instructions(base, mode, streams, long) - instructions(base, mode, streams, short)

    floor = diff("floor")
    return {m: (diff(m) - floor) / (streams * args.tokens) for m in modes}


def per_token_ns(args: argparse.Namespace, modes: list[str], streams: int) -> dict:
    head, reads, tail = record(streams, args.tokens)
    out = {}
    for mode in modes:
        run = runner(mode, streams)
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter_ns()
            run(head, reads, tail)
            best = min(best, time.perf_counter_ns() - t0)
        out[mode] = best / (streams * args.tokens)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,32", help="streams per read (comma list)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per stream (measured)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma list: " + ",".join(MODES))
    parser.add_argument("--time", action="store_true", help="ns per token, not instructions")
    parser.add_argument("--repeats", type=int, default=20, help="--time: runs, the fastest kept")
    parser.add_argument("--python", default=sys.executable, help="the checkout's python")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown modes: {sorted(unknown)}")
    if not args.time and shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind); or use --time")
    unit = "ns" if args.time else "instructions"
    print(f"{unit} per token; load average {os.getloadavg()[0]:.1f}")
    print("| streams per read | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for streams in [int(s) for s in args.streams.split(",")]:
        measure = per_token_ns if args.time else per_token_instructions
        row = measure(args, modes, streams)
        print(f"| {streams} | " + " | ".join(f"{row[m]:,.0f}" for m in modes) + " |")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
