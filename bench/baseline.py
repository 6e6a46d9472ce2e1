"""Latency of a short request through the whole stack vs straight to the mock engine over gRPC.

Both measured in one run on the same engine (the machine is shared and noisy: read the ratio,
not the absolute numbers). Sequential requests (concurrency 1), after a warm-up.

    python bench/baseline.py --protocol sglang --requests 300
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
from harness import pct, stack, started, stop

from switchyard.common.engines.connect import connect
from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir
from switchyard.protos.messages import GenerateFinished, GenerateRequest, SamplingParams

PROMPT = "Route this short request through the yard, please."
MAX_TOKENS = 8


async def floor(url: str, prompt_ids: list[int], n: int, warmup: int) -> list[float]:
    client = await connect(url)
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    out = []
    try:
        for i in range(warmup + n):
            req = GenerateRequest(
                request_id=f"floor-{i}", instance_id=0, token_ids=prompt_ids, sampling=sampling
            )
            start = time.perf_counter()
            async for event in client.generate(req):
                if type(event) is GenerateFinished:
                    break
            if i >= warmup:
                out.append(time.perf_counter() - start)
    finally:
        await client.close()
    return out


async def through_stack(base: str, n: int, warmup: int) -> list[float]:
    body = {
        "model": "deepseek-mock",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    out = []
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        for i in range(warmup + n):
            start = time.perf_counter()
            async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
                reply.raise_for_status()
                async for _ in reply.aiter_bytes():
                    pass
            if i >= warmup:
                out.append(time.perf_counter() - start)
    return out


def run(protocol: str, n: int, warmup: int) -> dict[str, float]:
    # Zero engine delays: what is left is the cost of the path itself.
    engine, report = started(
        "mock-engine", "--protocol", protocol, "--port", "0", "--ttft-ms", "0", "--itl-ms", "0",
        "--prefill-base-ms", "0", "--prefill-ms-per-token", "0", "--log-level", "WARNING",
    )  # fmt: skip
    url = f"grpc://127.0.0.1:{report['port']}"
    try:
        with stack("--worker", url) as base:
            tok = TokenizerBundle.from_dir(default_tokenizer_dir())
            chat = tok.chat_template.render([{"role": "user", "content": PROMPT}])
            direct = asyncio.run(floor(url, tok.encode(chat), n, warmup))
            routed = asyncio.run(through_stack(base, n, warmup))
    finally:
        stop(engine)
    row = {
        "floor_p50_ms": statistics.median(direct) * 1e3,
        "floor_p99_ms": pct(direct, 0.99) * 1e3,
        "stack_p50_ms": statistics.median(routed) * 1e3,
        "stack_p99_ms": pct(routed, 0.99) * 1e3,
    }
    row["p50_ratio"] = row["stack_p50_ms"] / row["floor_p50_ms"]
    row["p99_ratio"] = row["stack_p99_ms"] / row["floor_p99_ms"]
    row["added_p50_ms"] = row["stack_p50_ms"] - row["floor_p50_ms"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--protocol", action="append", choices=["sglang", "vllm"])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "baseline.md"))
    args = parser.parse_args()
    lines = [
        f"Short streamed chat request ({MAX_TOKENS} tokens, mock engine with zero delays), "
        f"{args.requests} sequential requests each, after {args.warmup} warm-up.",
        "",
        "| protocol | floor p50 ms | floor p99 ms | stack p50 ms | stack p99 ms "
        "| p50 ratio | p99 ratio | added p50 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for protocol in args.protocol or ["sglang", "vllm"]:
        r = run(protocol, args.requests, args.warmup)
        lines.append(
            f"| {protocol} | {r['floor_p50_ms']:.2f} | {r['floor_p99_ms']:.2f} | "
            f"{r['stack_p50_ms']:.2f} | {r['stack_p99_ms']:.2f} | {r['p50_ratio']:.2f} | "
            f"{r['p99_ratio']:.2f} | {r['added_p50_ms']:.2f} |"
        )
    table = "\n".join(lines)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    Path(args.out).write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
