"""Latency of a whole routing decision (RouterCore.route: prompt hashing, index and booking
lookups, filters, scorers, picker, load bookkeeping) for an 8k-token prompt over 64 workers
whose index holds prefixes of it of different lengths, with requests in flight. Prompts share
all but their last 64 tokens (a system prompt, a conversation); `--cold` makes each prompt
new from its first token. Wall-clock and CPU-time percentiles: on a shared machine the wall
clock counts the time other processes hold the core.

The same script measures the previous router too (before/after in one table): run it with
that checkout's interpreter, e.g. `/work/main/.venv/bin/python bench/route_decision.py`; it
builds the core with whichever router API it finds.

    python bench/route_decision.py [--workers 64] [--tokens 8192] [--rounds 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from switchyard.common.block_hash import block_hashes
from switchyard.protos.messages import Instance, RouteProgress, RouteRequest
from switchyard.router.core import RouterCore
from switchyard.router.kv.types import Stored

BLOCK = 16


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_core(rng: random.Random) -> tuple[RouterCore, Any, str]:
    """(core, worker key of an instance id, which router) for either router API."""
    try:
        from switchyard.router.config import preset
    except ImportError:  # the previous router: one Policy object, int worker ids
        from switchyard.router.policies import build_policy  # type: ignore[attr-defined]

        return RouterCore(build_policy("kv", rng)), lambda iid: iid, "previous (Policy.pick)"
    return RouterCore(preset("kv"), rng=rng), lambda iid: (iid, 0), "framework (kv preset)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument(
        "--cold",
        action="store_true",
        help="every prompt new from its first block (no hashes to reuse, no shared prefix)",
    )
    args = parser.parse_args()
    rng = random.Random(3)
    core, key, which = make_core(rng)
    instances = {
        i: Instance(
            instance_id=i,
            url=f"grpc://h{i}:{1000 + i}",
            protocol="vllm",
            model="m",
            context_length=65536,
            block_size=BLOCK,
            max_running_requests=256,
        )
        for i in range(1, args.workers + 1)
    }
    core.set_instances(instances)
    shared = [rng.randrange(100_000) for _ in range(args.tokens)]
    for iid in instances:  # each worker holds a different-length prefix of the shared prompt
        held = shared[: rng.randrange(0, args.tokens // BLOCK) * BLOCK]
        n = len(held) // BLOCK
        core.index.apply_batch(
            key(iid), [Stored([iid * 10**6 + k for k in range(n)], None, held, BLOCK)]
        )
    samples = []
    cpu = []  # this thread's CPU time per decision: what preemption on a shared box leaves out
    in_flight: list[tuple[str, int]] = []
    for n in range(args.rounds):
        if args.cold:
            tokens = [rng.randrange(100_000) for _ in range(args.tokens)]
        else:  # a shared prefix (a system prompt, a conversation) and a new tail
            tokens = shared[: args.tokens - 64] + [rng.randrange(100_000) for _ in range(64)]
        request = RouteRequest(request_id=f"r{n}", model="m", token_ids=tokens)
        start, start_cpu = time.perf_counter(), time.thread_time()
        routed = core.route(request, now=n * 0.001)
        samples.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        in_flight.append((f"r{n}", routed.response.instance_id))
        if len(in_flight) > 32:  # about 32 requests in flight
            rid, iid = in_flight.pop(0)
            core.progress(RouteProgress(rid, iid, "first_token"))
            core.progress(RouteProgress(rid, iid, "finished"))
    hashing = []
    for _ in range(500):
        start = time.thread_time()
        block_hashes(shared, BLOCK)
        hashing.append(time.thread_time() - start)
    us = [s * 1e6 for s in samples[100:]]
    cpu_us = [s * 1e6 for s in cpu[100:]]
    h = [s * 1e6 for s in hashing]
    print(
        f"{args.tokens}-token prompt, {args.workers} workers, index {len(core.index)} blocks, "
        f"router: {which}\n"
    )
    print("| | p50 µs | p99 µs |\n|---|---|---|")
    print(f"| route decision, wall clock | {statistics.median(us):.0f} | {pct(us, 0.99):.0f} |")
    print(
        f"| route decision, CPU time | {statistics.median(cpu_us):.0f} | {pct(cpu_us, 0.99):.0f} |"
    )
    print(
        f"| hashing the whole prompt (no reuse), CPU time | {statistics.median(h):.0f} | "
        f"{pct(h, 0.99):.0f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
