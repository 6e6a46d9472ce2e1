"""The router's per-request work, without sockets: instructions per request under callgrind.

A RouterService (the `kv` preset, two SGLang-protocol workers of 16-token blocks, as
bench/load.py's mock engines) is fed, encoded as on the wire, what its sockets bring for each
request of a closed loop: the route request (a new ~100-token prompt whose first block, the
chat template's, every engine holds), the engine's KV batch storing the prompt's blocks (and,
once its cache holds 2048 blocks, removing as many of the oldest), the first-token and the
finished notices (`--batched`: each kind of message in lists of 8, as a loaded preprocessor
sends them). The replies go to a socket stand-in that only counts. What is left out is what
the sockets cost (wake-ups, syscalls, ZMQ's I/O thread; bench/hops.py route measures the
round trip) and the timers (load polls).

The count is the difference of two runs of different lengths divided by the requests
between them, so start-up and imports cancel out; callgrind counts instructions, the same
on a busy machine as on an idle one. `--time`: CPU time per request instead (no valgrind).

    python bench/route_path.py                                   # this checkout
    python bench/route_path.py --python ../main/.venv/bin/python # another checkout
    python bench/route_path.py --time --requests 20000

Needs valgrind (`apt-get install valgrind`) unless `--time`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness import callgrind_instructions

HERE = Path(__file__).resolve().parent
BLOCK = 16
CACHE_BLOCKS = 2048  # per engine: past this, each store evicts as many of the oldest


def run(requests: int, batched: bool) -> float:
    """Feed `requests` requests through a RouterService; returns the CPU seconds it took."""
    import msgspec

    from switchyard.protos import codec
    from switchyard.protos.messages import (
        PROTOCOL_SGLANG,
        STAGE_FINISHED,
        STAGE_FIRST_TOKEN,
        Instance,
        RouteProgress,
        RouteRequest,
    )
    from switchyard.router.core import RouterCore
    from switchyard.router.kv.stream import KvStream
    from switchyard.router.service import RouterService

    rng = random.Random(7)
    instances = {
        iid: Instance(
            instance_id=iid,
            url=f"grpc://127.0.0.1:{9000 + iid}",
            protocol=PROTOCOL_SGLANG,
            model="deepseek-mock",
            context_length=32768,
            block_size=BLOCK,
        )
        for iid in (1, 2)
    }
    core = RouterCore()
    service = RouterService(core, "tcp://127.0.0.1:0", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    service.fleet._instances = MappingProxyType(instances)
    core.set_instances(instances)
    streams = {
        iid: KvStream((iid, 0), core.index, core.index.counters, service._ctx) for iid in instances
    }

    class Sent:
        messages = 0

        def send_multipart(self, frames: list[bytes]) -> None:
            self.messages += 1

    sent = Sent()
    service._sock = sent  # type: ignore[assignment]
    encoder = msgspec.msgpack.Encoder()
    seqs = dict.fromkeys(instances, 0)
    cached: dict[int, list[int]] = {iid: [] for iid in instances}  # engine hashes, oldest first
    template = [rng.randrange(100_000) for _ in range(BLOCK)]  # every prompt's first block
    root = {iid: rng.getrandbits(63) for iid in instances}
    identity = b"\x00preprocessor"

    def kv_batch(iid: int, tokens: list[int]) -> bytes:
        """The engine's step: the prompt's blocks past the first stored, the oldest evicted."""
        hashes = [rng.getrandbits(63) for _ in range(len(tokens) // BLOCK - 1)]
        stored = {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": root[iid],
            "token_ids": tokens[BLOCK : BLOCK * (len(hashes) + 1)],
            "block_size": BLOCK,
            "lora_id": None,
            "medium": "GPU",
        }
        events: list[dict[str, Any]] = [stored]
        held = cached[iid]
        held.extend(hashes)
        if len(held) > CACHE_BLOCKS:
            gone, cached[iid] = held[: len(hashes)], held[len(hashes) :]
            events.append({"type": "BlockRemoved", "block_hashes": gone, "medium": "GPU"})
        return encoder.encode([time.time(), events, 0])

    def prompt(i: int) -> list[int]:
        return template + [rng.randrange(100_000) for _ in range(80 + i % 32)]

    def deliver(messages: list[Any]) -> None:
        if batched and len(messages) > 1:
            service._on_message([identity, codec.encode(messages)])
        else:
            for message in messages:
                service._on_message([identity, codec.encode(message)])

    group = 8 if batched else 1
    every = [prompt(i) for i in range(requests)]
    started = time.process_time()
    for first in range(0, requests, group):
        ids = [f"req-{i}" for i in range(first, min(first + group, requests))]
        prompts = every[first : first + len(ids)]
        before = len(core.tracker)
        deliver(
            [
                RouteRequest(request_id=r, model="deepseek-mock", token_ids=p)
                for r, p in zip(ids, prompts, strict=True)
            ]
        )
        assert len(core.tracker) == before + len(ids)
        for r, p in zip(ids, prompts, strict=True):
            iid = core.tracker._requests[r].key[0]
            seqs[iid] += 1
            streams[iid].feed(seqs[iid] - 1, kv_batch(iid, p))
        deliver(
            [RouteProgress(r, core.tracker._requests[r].key[0], STAGE_FIRST_TOKEN) for r in ids]
        )
        deliver([RouteProgress(r, core.tracker._requests[r].key[0], STAGE_FINISHED) for r in ids])
    spent = time.process_time() - started
    assert len(core.tracker) == 0 and sent.messages >= requests // group
    return spent


def child(requests: int, batched: bool) -> float:
    async def main() -> float:
        return run(requests, batched)

    return asyncio.run(main())


def instructions(python: str, requests: int, batched: bool) -> int:
    argv = [python, str(Path(__file__).resolve()), "--child", str(requests)]
    if batched:
        argv.append("--batched")
    return callgrind_instructions(argv, "route-path-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the checkout's interpreter")
    parser.add_argument("--requests", type=int, default=400, help="requests between the runs")
    parser.add_argument("--batched", action="store_true", help="messages in lists of 8")
    parser.add_argument("--time", action="store_true", help="CPU time, no callgrind")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        spent = child(args.child, args.batched)
        print(f"{spent:.6f}")
        return
    if args.time:
        argv = [args.python, str(Path(__file__).resolve()), "--child", str(args.requests)]
        if args.batched:
            argv.append("--batched")
        out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=HERE)
        spent = float(out.stdout.split()[-1])
        print(f"{1e6 * spent / args.requests:.1f} us CPU per request ({args.requests} requests)")
        return
    base = 200
    short = instructions(args.python, base, args.batched)
    long = instructions(args.python, base + args.requests, args.batched)
    per = (long - short) / args.requests
    print(
        f"router instructions per request: {per:,.0f} "
        f"({'lists of 8' if args.batched else 'one message each'}, {args.python})"
    )


if __name__ == "__main__":
    main()
