"""Route decision latency of the KV policy: an 8k-token prompt over 16 workers whose index
holds realistic overlaps (RouterCore.route: prompt hashing, index and predicted-prefix
lookups, cost, pick, load bookkeeping).

    python bench/route_decision.py
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from harness import pct

from switchyard.common.block_hash import block_hashes
from switchyard.protos.messages import Instance, RouteProgress, RouteRequest
from switchyard.router.core import RouterCore
from switchyard.router.kv.types import Stored
from switchyard.router.policies import build_policy

WORKERS = 16
BLOCK = 16
PROMPT_TOKENS = 8192


def main() -> int:
    rng = random.Random(3)
    core = RouterCore(build_policy("kv", rng))
    instances = {
        i: Instance(
            instance_id=i,
            url=f"grpc://h:{i}",
            protocol="vllm",
            model="m",
            context_length=32768,
            block_size=BLOCK,
        )
        for i in range(1, WORKERS + 1)
    }
    core.set_instances(instances)
    shared = [rng.randrange(100_000) for _ in range(PROMPT_TOKENS)]
    for iid in instances:  # each worker holds a different-length prefix of the shared prompt
        held = shared[: rng.randrange(0, PROMPT_TOKENS // BLOCK) * BLOCK]
        n = len(held) // BLOCK
        core.index.apply_batch(
            iid,
            [
                Stored(
                    block_hashes=[iid * 10**6 + k for k in range(n)],
                    parent=None,
                    token_ids=held,
                    block_size=BLOCK,
                )
            ],
        )
    samples = []
    for n in range(2000):
        tokens = shared[: PROMPT_TOKENS - 64] + [rng.randrange(100_000) for _ in range(64)]
        request = RouteRequest(request_id=f"r{n}", model="m", token_ids=tokens)
        start = time.perf_counter()
        routed = core.route(request, now=n * 0.001)
        samples.append(time.perf_counter() - start)
        core.progress(RouteProgress(f"r{n}", routed.response.instance_id, "finished"))
    hashing = []
    for _ in range(500):
        start = time.perf_counter()
        block_hashes(shared, BLOCK)
        hashing.append(time.perf_counter() - start)
    us = [s * 1e6 for s in samples[100:]]
    print(f"{PROMPT_TOKENS}-token prompt, {WORKERS} workers, index {len(core.index)} blocks\n")
    print("| | p50 µs | p99 µs |\n|---|---|---|")
    print(
        f"| route decision (whole RouterCore.route) | {statistics.median(us):.0f} | "
        f"{pct(us, 0.99):.0f} |"
    )
    h = [s * 1e6 for s in hashing]
    print(f"| of which prompt hashing | {statistics.median(h):.0f} | {pct(h, 0.99):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
