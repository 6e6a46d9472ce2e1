"""How KV routing spreads unique prompts over identical engines, phase after phase.

Two (`--engines`) SGLang-protocol mock engines and `switchyard up --router-mode kv`, then the
phases of the load bench on one stack: a warm-up at concurrency 32, then concurrency 1, 32 and
128 (streamed chats, 48-word prompts nobody shares, 16 tokens). Per phase: each engine's
share of the engines' CPU (they are alike, so the share is the share of the work), and after
it the price each worker has in the router's time model (`POST /debug/route`: `ttft_ms`).
`--runs` fresh stacks, one after another: a skewed spread shows in some runs only.

    python bench/kv_balance.py                # 3 runs
    python bench/kv_balance.py --runs 5 --engines 4
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import httpx
from load import MODEL, Processes, served_tokenizer_dir, start_engines, switchyard_stack
from loadgen import HttpTarget, closed_loop, prompts
from procstat import read_stat

PHASES = (("warm-up c32", 32, 128), ("c1", 1, 75), ("c32", 32, 320), ("c128", 128, 640))


def engine_cpu(pids: list[int]) -> list[float]:
    return [(read_stat(pid) or (0, 0.0))[1] for pid in pids]


def prices(base: str) -> list[float]:
    """Each worker's predicted TTFT (ms) for a short new prompt, in engine order of the reply."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "price"}], "max_tokens": 1}
    reply = httpx.post(base + "/debug/route", json=body, timeout=30).json()
    rows = sorted(reply["workers"], key=lambda w: w["url"])
    return [round(w["ttft_ms"], 1) for w in rows]


async def run_phases(base: str, pids: list[int], run: int) -> list[str]:
    target = HttpTarget("kv", base, MODEL, 16)
    await target.open()
    lines = []
    try:
        for name, concurrency, n in PHASES:
            before = engine_cpu(pids)
            items = prompts("kv", f"{name}-{run}", n, 48, run)
            await closed_loop(target, items, concurrency, lambda: None)
            used = [b - a for a, b in zip(before, engine_cpu(pids), strict=True)]
            shares = " / ".join(f"{u / max(sum(used), 1e-9):.0%}" for u in used)
            lines.append(f"| {run} | {name} | {shares} | {prices(base)} |")
    finally:
        await target.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--engines", type=int, default=2)
    args = parser.parse_args()
    lines = ["| run | phase | engine CPU shares | worker prices after (ms) |", "|---|---|---|---|"]
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="kv-balance-") as tmp:
            procs = Processes(Path(tmp))
            try:
                tokenizer, _ = served_tokenizer_dir(Path(tmp) / "tokenizer")
                engines, _, kv_urls = start_engines(procs, args.engines, tokenizer, 20.0, 5.0)
                with switchyard_stack(procs, f"kv-{run}", kv_urls, "kv") as (base, _):
                    lines += asyncio.run(run_phases(base, [e.pid for e in engines], run))
            finally:
                procs.stop_all()
        print("\n".join(lines[-len(PHASES) :]), flush=True)
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
