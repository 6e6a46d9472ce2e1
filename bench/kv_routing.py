"""KV-aware routing vs round-robin vs random on a shared-prefix workload, in one run.

4 mock engines with a realistic prefill cost (per uncached token, superlinear for long
prompts). Workload: G groups x P prompts; each prompt is its group's long system prompt plus a
short question; Poisson arrivals. For each router mode a fresh stack (fresh engine caches)
serves the same request sequence. Reported: prefix hit rate (sum of engine-reported
cached_tokens / sum of prompt_tokens), mean and p90 time to first token, and the TTFT ratio
of each mode to round-robin.

    python bench/kv_routing.py --groups 8 --per-group 6 --rate 6
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
from harness import pct, stack

MODES = ("kv", "round_robin", "random")
ENGINE_ARGS = [
    "--mock-arg=--prefill-ms-per-token=0.08",
    "--mock-arg=--prefill-base-ms=5",
    "--mock-arg=--num-blocks=2048",
]


@dataclass
class Result:
    ttft: float
    prompt_tokens: int
    cached_tokens: int


def workload(groups: int, per_group: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    items = []
    for g in range(groups):
        system = f"You are assistant {g} of the rail yard. " + " ".join(
            f"Rule {g}.{i}: wagon {rng.randrange(10**6)} goes to track {rng.randrange(99)}."
            for i in range(70)
        )
        for q in range(per_group):
            question = f"Where does wagon {rng.randrange(10**6)} go, question {q}?"
            items.append(
                [{"role": "system", "content": system}, {"role": "user", "content": question}]
            )
    rng.shuffle(items)
    return items


async def one(http: httpx.AsyncClient, messages: list[dict]) -> Result:
    body = {
        "model": "deepseek-mock",
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    start = time.perf_counter()
    ttft = None
    usage = None
    async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert ttft is not None and usage is not None
    return Result(ttft, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"])


async def drive(base: str, items: list[list[dict]], rate: float, seed: int) -> list[Result]:
    rng = random.Random(seed)
    async with httpx.AsyncClient(
        base_url=base, timeout=120, limits=httpx.Limits(max_connections=256)
    ) as http:
        tasks = []
        for messages in items:
            tasks.append(asyncio.create_task(one(http, messages)))
            await asyncio.sleep(rng.expovariate(rate))
        return list(await asyncio.gather(*tasks))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--per-group", type=int, default=10)
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second (Poisson)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "kv_routing.md"))
    args = parser.parse_args()
    items = workload(args.groups, args.per_group, args.seed)
    engines = ",".join(["vllm", "sglang"] * (args.engines // 2) + ["vllm"] * (args.engines % 2))
    rows = {}
    for mode in MODES:
        with stack("--mock-engines", engines, "--router-mode", mode, *ENGINE_ARGS) as base:
            results = asyncio.run(drive(base, items, args.rate, args.seed))
        ttfts = [r.ttft * 1e3 for r in results]
        rows[mode] = {
            "hit": sum(r.cached_tokens for r in results) / sum(r.prompt_tokens for r in results),
            "mean": statistics.mean(ttfts),
            "p90": pct(ttfts, 0.9),
            "cold": sum(1 for r in results if r.cached_tokens == 0),
            "n": len(results),
        }
        print(f"{mode}: done", file=sys.stderr)
    base_row = rows["round_robin"]
    lines = [
        f"{args.engines} mock engines, {args.groups} groups x {args.per_group} prompts "
        f"(~{len(items[0][0]['content']) // 4} token shared system prompt), Poisson "
        f"{args.rate}/s, seed {args.seed}.",
        "",
        "| mode | prefix hit rate | requests with nothing cached | TTFT mean ms | TTFT p90 ms "
        "| mean / round-robin | p90 / round-robin |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, r in rows.items():
        lines.append(
            f"| {mode} | {r['hit']:.1%} | {r['cold']}/{r['n']} | "
            f"{r['mean']:.1f} | {r['p90']:.1f} | "
            f"{r['mean'] / base_row['mean']:.2f} | {r['p90'] / base_row['p90']:.2f} |"
        )
    table = "\n".join(lines)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
