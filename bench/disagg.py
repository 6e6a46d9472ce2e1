"""Disaggregated vs aggregated serving on the same number of mock engines, and what the
prefill-hop skip threshold does. One run, ratios within it.

Scenarios (3 vLLM-protocol mock engines each, fresh stack each):
  aggregated        3 engines that do everything
  disaggregated     1 prefill + 2 decode engines (every request takes the prefill hop)
  hop always / hop skipped for short prompts: 1 prefill + 2 decode engines that can also
  prefill (kv_both), router --disagg-min-uncached-tokens 0 vs 512
  aggregated / disaggregated / 2 prefill + 1 decode, prefill stalls decode: with the mocks'
  --prefill-stalls-decode (prefills one at a time, holding up the running requests' decode
  steps, as on a GPU without chunked prefill): what disaggregation is for. Compare them with
  each other (the ratio columns), not with the scenarios above.
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
    "aggregated, prefill stalls decode": [
        "--mock-engines",
        "vllm,vllm,vllm",
        "--mock-arg=--prefill-stalls-decode",
    ],
    "disaggregated, prefill stalls decode": [
        "--mock-prefill",
        "vllm",
        "--mock-decode",
        "vllm,vllm",
        "--mock-arg=--prefill-stalls-decode",
    ],
    "2 prefill + 1 decode, prefill stalls decode": [
        "--mock-prefill",
        "vllm,vllm",
        "--mock-decode",
        "vllm",
        "--mock-arg=--prefill-stalls-decode",
    ],
}
STALLS = "aggregated, prefill stalls decode"
BASELINE = {name: STALLS for name in SCENARIOS if "stalls" in name}  # ratios against


def prompts(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = "short" if i % 2 else "long"
        words = 40 if kind == "short" else 900
        text = " ".join(f"w{rng.randrange(10**6)}" for _ in range(words))
        out.append((kind, text))
    return out


async def one(http: httpx.AsyncClient, text: str) -> tuple[float, float, int, list[float]]:
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
    last = 0.0
    gaps: list[float] = []  # between content chunks: the inter-token latency seen
    tokens = 0
    async with http.stream("POST", "/v1/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line.startswith("data: {"):
                chunk = orjson.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - start
                    else:
                        gaps.append(now - last)
                    last = now
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    return ttft or 0.0, time.perf_counter() - start, tokens, gaps


async def drive(base: str, items: list[tuple[str, str]], concurrency: int):
    queue = list(enumerate(items))
    results: dict[int, tuple[str, float, float, int, list[float]]] = {}

    async def worker(http: httpx.AsyncClient) -> None:
        while queue:
            i, (kind, text) = queue.pop(0)
            results[i] = (kind, *await one(http, text))

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
        row: dict = {"tok_s": sum(r[3] for r in results) / wall}
        for kind in ("short", "long"):
            ttfts = [r[1] * 1e3 for r in results if r[0] == kind]
            row[kind] = (statistics.mean(ttfts), pct(ttfts, 0.9))
        gaps = [g * 1e3 for r in results for g in r[4]]
        row["itl"] = (pct(gaps, 0.5), pct(gaps, 0.99))
        rows[name] = row
        print(f"{name}: done", file=sys.stderr)
    lines = [
        "3 vLLM-protocol mock engines per scenario, 36 unique prompts (half ~120, half ~2700 "
        "tokens), 32 output tokens, concurrency 6. ITL: gaps between content chunks of every "
        "request. Ratios: against `aggregated` (the stall scenarios: against the aggregated "
        "one with stalls).",
        "",
        "| scenario | TTFT short mean/p90 ms | TTFT long mean/p90 ms | ITL p50/p99 ms "
        "| output tok/s | long TTFT ratio | ITL p99 ratio | tok/s ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        b = rows[BASELINE.get(name, "aggregated")]
        lines.append(
            f"| {name} | {r['short'][0]:.0f} / {r['short'][1]:.0f} | {r['long'][0]:.0f} / "
            f"{r['long'][1]:.0f} | {r['itl'][0]:.1f} / {r['itl'][1]:.1f} | {r['tok_s']:.0f} "
            f"| {r['long'][0] / b['long'][0]:.2f} | {r['itl'][1] / b['itl'][1]:.2f} "
            f"| {r['tok_s'] / b['tok_s']:.2f} |"
        )
    table = "\n".join(lines)
    out = Path(__file__).parent / "results" / "disagg.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
