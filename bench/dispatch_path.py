"""The dispatcher's per-token work, without sockets: instructions per token under callgrind.

Engine bytes (HTTP/2 frames of gRPC Generate replies, as an SGLang engine writes them) are
made up front and fed to the dispatcher's own objects: an engine connection (engines/http2.py
and its frame reader, frames.py) driven by run_generation, into the Outbox, whose ZMQ socket
is a stand-in that only counts. What is left out is what the sockets cost (the wake-ups,
the syscalls, ZMQ's I/O thread): bench/paced_hop.py measures that floor.

Every read carries one frame per stream, as an engine's decode step does: `--streams 1` is
concurrency 1 (a read per token), `--streams 32` a batch of 32. The count is the difference of
two runs of different lengths divided by the tokens between them, so start-up and imports
cancel out, less the same difference of a run that only builds the frames and turns the loop
(the harness's own share); callgrind counts instructions, the same on a busy machine as on an
idle one. The per-request column includes the harness's per-request work.

    python bench/dispatch_path.py                        # streams 1 and 32, this checkout
    python bench/dispatch_path.py --streams 1 --tokens 64
    python bench/dispatch_path.py --python ../main/.venv/bin/python   # another checkout
    SWITCHYARD_NATIVE=0 python bench/dispatch_path.py     # the pure-Python forms
    SWITCHYARD_NATIVE=0 python bench/dispatch_path.py --framing h2   # the h2 library

Needs valgrind (`apt-get install valgrind`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from harness import callgrind_instructions

HERE = Path(__file__).resolve().parent


def _h2_connection(http2: Any) -> type:
    """Http2Connection with the `h2` library doing the HTTP/2 framing (a pure-Python HTTP/2
    stack, the project of the pinned hpack): the same calls, fed from h2's events."""
    import h2.config
    import h2.connection
    import h2.events

    data_received_event = h2.events.DataReceived
    response_event = h2.events.ResponseReceived
    trailers_event = h2.events.TrailersReceived

    class H2Connection(http2.Http2Connection):  # type: ignore[misc,name-defined]
        def __init__(self, streams: Any) -> None:
            super().__init__(streams)
            config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
            self._h2 = h2.connection.H2Connection(config)
            self._h2.initiate_connection()
            self._h2.data_to_send()

        async def start(self, call: Any, header_block: bytes, message: bytes) -> None:
            await super().start(call, header_block, message)
            request = [(":method", "POST"), (":scheme", "http"), (":path", "/g")]
            request += [(":authority", "e"), ("content-type", "application/grpc")]
            self._h2.send_headers(call.stream_id, request, end_stream=True)
            self._h2.data_to_send()

        def data_received(self, data: bytes) -> None:
            conn, calls = self._h2, self.calls
            for event in conn.receive_data(data):
                kind = type(event)
                if kind is data_received_event:
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    call = calls.get(event.stream_id)
                    if call is not None:
                        call.data(event.data)
                elif kind is response_event or kind is trailers_event:
                    call = calls.get(event.stream_id)
                    if call is not None:
                        call.headers(event.headers, kind is trailers_event)
            out = conn.data_to_send()
            if out and self.transport is not None:
                self.transport.write(out)

    return H2Connection


def _child(streams: int, tokens: int, rounds: int, mode: str) -> None:
    """`mode` floor: the same loop, frames built and the loop turned, but no dispatcher;
    h2: the `h2` library does the framing."""
    floor = mode == "floor"
    import grpc
    import hpack
    import uvloop
    from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

    from switchyard.common.engines import http2
    from switchyard.common.engines.sglang import SglangClient
    from switchyard.dispatcher.outbox import Outbox
    from switchyard.dispatcher.stall import StallWatch
    from switchyard.dispatcher.streams import run_generation
    from switchyard.protos.messages import GenerateRequest, SamplingParams

    relay_type = getattr(http2, "Relay", None)  # None in a checkout from before the relay
    if relay_type is not None:
        from switchyard.common.engines import frames

        if not frames.NATIVE or mode == "h2":  # as DispatcherService: only the C reader relays
            relay_type = None

    class Transport:
        def write(self, data: bytes) -> None:
            pass

        def close(self) -> None:
            pass

        def abort(self) -> None:
            pass

    class Socket:
        messages = 0

        def send_multipart(self, frames: list[bytes]) -> None:
            self.messages += 1

    encoder = hpack.Encoder()

    def headers(stream: int, block: list[tuple[str, str]], end: bool) -> bytes:
        flags = http2.END_HEADERS | (http2.END_STREAM if end else 0)
        return http2.frame(http2.HEADERS, flags, stream, encoder.encode(block))

    def data(stream: int, message: bytes) -> bytes:
        return http2.frame(
            http2.DATA, 0, stream, b"\x00" + len(message).to_bytes(4, "big") + message
        )

    rid = "chatcmpl-" + "0" * 32
    chunks = [
        pb.GenerateResponse(
            request_id=rid,
            chunk=pb.GenerateStreamChunk(
                token_ids=[1000 + t], prompt_tokens=32, completion_tokens=t + 1
            ),
        ).SerializeToString()
        for t in range(tokens)
    ]
    complete = pb.GenerateResponse(
        request_id=rid,
        complete=pb.GenerateComplete(
            output_ids=[1000 + tokens - 1],
            finish_reason="length",
            prompt_tokens=32,
            completion_tokens=tokens,
        ),
    ).SerializeToString()

    async def main() -> None:
        # No keepalive pings: nothing answers them here, and under valgrind a run outlasts
        # the ping's time and deadline (16 s of wall clock), which would drop the connection.
        streams_ = http2.Http2Streams("127.0.0.1", 1, keepalive_time=1e9)
        connection = _h2_connection(http2) if mode == "h2" else http2.Http2Connection
        conn = connection(streams_)
        conn.connection_made(Transport())  # type: ignore[arg-type]
        conn.data_received(http2.frame(http2.SETTINGS, 0, 0))  # the engine's preface
        streams_._conn = conn
        client = SglangClient(grpc.aio.insecure_channel("127.0.0.1:1"), 1, streams_)
        socket = Socket()
        outbox = Outbox(socket, lambda peer: None, None, 0.0)  # type: ignore[arg-type]
        activity = StallWatch(4.0).activity(1, 0.0)
        sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

        def send(reply: object) -> None:  # as DispatcherService._start's
            activity.replies += 1
            activity.armed = True
            outbox.post(b"peer", reply)

        def relayed(n: int) -> None:  # as DispatcherService._relayed's
            activity.replies += n
            activity.armed = True
            outbox.schedule()

        for r in range(rounds):
            jobs = []
            if floor:
                ids = [2 * (r * streams + k) + 1 for k in range(streams)]
                for chunk in chunks:
                    b"".join(data(s, chunk) for s in ids)
                    await asyncio.sleep(0)
                continue
            for k in range(streams):
                request = GenerateRequest(
                    request_id=f"chatcmpl-{r:08x}{k:024x}",
                    instance_id=1,
                    token_ids=list(range(100, 132)),
                    sampling=sampling,
                )
                extra = []
                if relay_type is not None:
                    extra = [None, relay_type(outbox.batch(b"peer"), relayed)]
                job = run_generation(client, request, send, lambda *a: None, None, *extra)
                jobs.append(asyncio.ensure_future(job))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            ids = sorted(conn.calls)
            ok = [(":status", "200"), ("content-type", "application/grpc")]
            conn.data_received(b"".join(headers(s, ok, False) for s in ids))
            for chunk in chunks:
                conn.data_received(b"".join(data(s, chunk) for s in ids))
                await asyncio.sleep(0)
            trailers = [("grpc-status", "0")]
            conn.data_received(
                b"".join(data(s, complete) + headers(s, trailers, True) for s in ids)
            )
            await asyncio.gather(*jobs)
            await asyncio.sleep(0)
        assert floor or socket.messages > 0

    uvloop.run(main())


def instructions(python: str, streams: int, tokens: int, rounds: int, mode: str = "") -> int:
    argv = [python, str(Path(__file__)), "--child", str(streams), str(tokens), str(rounds)]
    argv += [mode] if mode else []
    return callgrind_instructions(argv, "dispatch-path-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,32", help="streams per read (comma list)")
    parser.add_argument("--tokens", type=int, default=256, help="more tokens per stream (long run)")
    parser.add_argument("--python", default=sys.executable, help="the checkout's python")
    parser.add_argument(
        "--framing",
        choices=["", "h2"],
        default="",
        help="h2: the h2 library does the HTTP/2 framing (the bench extra), no relay",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    native = os.environ.get("SWITCHYARD_NATIVE", "")
    print(f"python: {args.python}  SWITCHYARD_NATIVE={native}  framing: {args.framing or 'own'}")
    print("| streams per read | instructions per token | per request of 16 tokens |")
    print("|---|---|---|")
    for streams in [int(s) for s in args.streams.split(",")]:
        rounds = max(2, 32 // streams)
        mode = args.framing
        short = instructions(args.python, streams, 16, rounds, mode)
        long = instructions(args.python, streams, 16 + args.tokens, rounds, mode)
        twice = instructions(args.python, streams, 16, 2 * rounds, mode)
        floor_short = instructions(args.python, streams, 16, rounds, "floor")
        floor_long = instructions(args.python, streams, 16 + args.tokens, rounds, "floor")
        long -= floor_long - floor_short  # the loop and the frames, not the dispatcher's
        per_token = (long - short) / (rounds * streams * args.tokens)
        per_request = (twice - short) / (rounds * streams)
        print(f"| {streams} | {per_token:,.0f} | {per_request:,.0f} |")


if __name__ == "__main__":
    if len(sys.argv) in (5, 6) and sys.argv[1] == "--child":
        _child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), (sys.argv + [""])[5])
    else:
        main()
