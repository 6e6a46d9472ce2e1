"""Disaggregated vs aggregated serving on the same number of mock engines, and what the
prefill-hop skip threshold does. One run, ratios within it.

Scenarios (3 vLLM-protocol mock engines each, fresh stack each):
  aggregated        3 engines that do everything
  disaggregated     1 prefill + 2 decode engines (every request takes the prefill hop)
  hop always / hop skipped for short prompts: 1 prefill + 2 decode engines that can also
  prefill (kv_both), router --disagg-min-uncached-tokens 0 vs 512
Workload: unique prompts (no shared prefix), half short (40 random words, ~120 tokens),
half long (900 words, ~2.7k tokens), 32 output tokens each, closed loop at concurrency 6.

    python bench/disagg.py
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

import httpx
import orjson
from harness import pct, stack

ENGINE = ["--mock-arg=--prefill-ms-per-token=0.08", "--mock-arg=--kv-connector=NixlConnector"]
SCENARIOS = {
    "aggregated": ["--mock-engines", "vllm,vllm,vllm"],
    "disaggregated": ["--mock-prefill", "vllm", "--mock-decode", "vllm,vllm"],
    "hop always (threshold 0)": [
        "--mock-prefill",
        "vllm",
        "--mock-engines",
        "vllm,vllm",
        "--router-arg=--disagg-min-uncached-tokens=0",
    ],
    "hop skipped under 512 uncached": [
        "--mock-prefill",
        "vllm",
        "--mock-engines",
        "vllm,vllm",
        "--router-arg=--disagg-min-uncached-tokens=512",
    ],
}


def prompts(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = "short" if i % 2 else "long"
        words = 40 if kind == "short" else 900
        text = " ".join(f"w{rng.randrange(10**6)}" for _ in range(words))
        out.append((kind, text))
    return out


async def one(http: httpx.AsyncClient, text: str) -> tuple[float, float, int]:
    body = {
        "model": "deepseek-mock",
        "prompt": text,
        "max_tokens": 32,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = None
    tokens = 0
    async with http.stream("POST", "/v1/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line.startswith("data: {"):
                chunk = orjson.loads(line[6:])
                if ttft is None and chunk["choices"] and chunk["choices"][0]["text"]:
                    ttft = time.perf_counter() - start
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    return ttft or 0.0, time.perf_counter() - start, tokens


async def drive(base: str, items: list[tuple[str, str]], concurrency: int):
    queue = list(enumerate(items))
    results: dict[int, tuple[str, float, float, int]] = {}

    async def worker(http: httpx.AsyncClient) -> None:
        while queue:
            i, (kind, text) = queue.pop(0)
            ttft, e2e, tokens = await one(http, text)
            results[i] = (kind, ttft, e2e, tokens)

    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        await one(http, "warm up")
        start = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return list(results.values()), wall


def main() -> int:
    items = prompts(36, seed=5)
    rows = {}
    for name, args in SCENARIOS.items():
        with stack(*args, *ENGINE) as base:
            results, wall = asyncio.run(drive(base, items, concurrency=6))
        row = {"tok_s": sum(r[3] for r in results) / wall}
        for kind in ("short", "long"):
            ttfts = [r[1] * 1e3 for r in results if r[0] == kind]
            row[kind] = (statistics.mean(ttfts), pct(ttfts, 0.9))
        rows[name] = row
        print(f"{name}: done", file=sys.stderr)
    base_row = rows["aggregated"]
    lines = [
        "3 vLLM-protocol mock engines per scenario, 36 unique prompts (half ~120, half ~2700 "
        "tokens), 32 output tokens, concurrency 6.",
        "",
        "| scenario | TTFT short mean/p90 ms | TTFT long mean/p90 ms | output tok/s | "
        "long TTFT / aggregated | tok/s / aggregated |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['short'][0]:.0f} / {r['short'][1]:.0f} | {r['long'][0]:.0f} / "
            f"{r['long'][1]:.0f} | {r['tok_s']:.0f} | {r['long'][0] / base_row['long'][0]:.2f} "
            f"| {r['tok_s'] / base_row['tok_s']:.2f} |"
        )
    table = "\n".join(lines)
    out = Path(__file__).parent / "results" / "disagg.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
