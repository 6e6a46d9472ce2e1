"""What keeping responses costs: POST /v1/responses with `store` on vs off, on SQLite and on
PostgreSQL, closed loop at concurrency 32, streamed.

One stack per backend (`switchyard up`, one mock engine): SQLite in a temporary data folder;
PostgreSQL a throwaway server from Debian's binaries with its default durability (fsync on)
on a unix socket. Rounds: each round runs the same load with store off, then on (the order
alternates between rounds, so a noisy neighbour on a shared machine hits both alike). Per
phase: the preprocessor's CPU per request (utime + stime from /proc, its threads included:
SQLite's writes run on a thread of its own), the PostgreSQL server's (all its processes),
and TTFT (first response.output_text.delta) p50 / p99; each as the median over rounds, CPU
also as the ratio on / off. Every request of a `store` phase writes one response; none
reads one (see docs/storage.md for what a previous_response_id read adds).

    python bench/stored.py            # the full run
    python bench/stored.py --quick    # tiny, for a smoke test

Results: bench/results/stored.md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from harness import pct, started, stop, wait_ready
from loadgen import HttpTarget, Prompt, Sample, closed_loop, prompts
from procstat import CpuMeter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.postgres import PostgresServer, throwaway_postgres  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL = "deepseek-mock"


class ResponsesTarget(HttpTarget):
    """Streamed POST /v1/responses; TTFT at the first output_text delta."""

    def __init__(self, name: str, base: str, max_tokens: int, store: bool) -> None:
        super().__init__(name, base, MODEL, max_tokens)
        self.store = store

    async def send(self, index: int, prompt: Prompt) -> Sample:
        http = self.clients[index % len(self.clients)]
        body = {
            "model": MODEL,
            "input": prompt.messages[0]["content"],
            "max_output_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "store": self.store,
        }
        start = time.perf_counter()
        first = last = 0.0
        deltas = 0
        tokens = 0
        try:
            async with http.stream("POST", "/v1/responses", json=body) as reply:
                if reply.status_code != 200:
                    text = (await reply.aread())[:200].decode(errors="replace")
                    return Sample(ok=False, error=f"HTTP {reply.status_code}: {text}")
                async for line in reply.aiter_lines():
                    if line.startswith('data: {"type":"response.output_text.delta"'):
                        last = time.perf_counter() - start
                        if not deltas:
                            first = last
                        deltas += 1
                    elif line.startswith('data: {"type":"response.completed"') or line.startswith(
                        'data: {"type":"response.incomplete"'
                    ):
                        event = orjson.loads(line[6:])
                        tokens = event["response"]["usage"]["output_tokens"]
                        if event["response"]["store"] is not self.store:
                            return Sample(ok=False, error="store not as asked")
        except (httpx.HTTPError, OSError) as exc:
            return Sample(ok=False, error=f"{type(exc).__name__}: {exc}"[:200])
        end = time.perf_counter() - start
        if not tokens:
            return Sample(ok=False, error="no final event")
        if not deltas:  # the mock's token soup can end at once (EOS): no TTFT to take
            return Sample(ok=True, ttft=-1.0, e2e=end, tokens=tokens, last=end)
        return Sample(ok=True, ttft=first, e2e=end, tokens=tokens, last=last)


async def phase(
    base: str, store: bool, n: int, words: int, tokens: int, concurrency: int, tag: str,
    meter: CpuMeter,
) -> dict[str, Any]:  # fmt: skip
    target = ResponsesTarget(f"store-{'on' if store else 'off'}", base, tokens, store)
    items = prompts(tag, f"{store}", n, words, seed=7)
    await target.open()
    try:
        await closed_loop(target, items[: min(concurrency, n)], concurrency, lambda: None)  # warm
        before = meter.snapshot()
        samples, wall = await closed_loop(target, items, concurrency, lambda: None)
        after = meter.snapshot()
    finally:
        await target.close()
    spent = meter.diff(before, after)
    failed = [s.error for s in samples if not s.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, e.g. {failed[0]}")
    ttfts = [s.ttft for s in samples if s.ttft >= 0]
    return {
        "store": store,
        "requests": len(samples),
        "req_per_s": len(samples) / wall,
        "preprocessor_us": sum(spent["preprocessor"].values()) / len(samples) * 1e6,
        "database_us": sum(spent.get("database", {}).values()) / len(samples) * 1e6,
        "ttft_p50_ms": pct(ttfts, 0.5) * 1e3,
        "ttft_p99_ms": pct(ttfts, 0.99) * 1e3,
    }


def run_backend(
    name: str, up_args: list[str], pg: PostgresServer | None, args: argparse.Namespace
) -> list[dict[str, Any]]:
    proc, report = started(
        "up", "--http-port", "0", "--log-level", "WARNING", "--mock-engines", "sglang",
        "--mock-speedup", str(args.speedup), *up_args, timeout=180, start_new_session=True,
    )  # fmt: skip
    try:
        base = report["base_url"]
        wait_ready(base, proc, 180)
        groups = {"preprocessor": [int(report["pids"]["preprocessor"])]}
        if pg is not None:
            groups["database"] = [pg.pid]
        meter = CpuMeter(groups, own_only={"preprocessor"})
        out = []
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for store in order:
                result = asyncio.run(
                    phase(
                        base, store, args.requests, args.words, args.tokens,
                        args.concurrency, f"{name}{r}", meter,
                    )
                )  # fmt: skip
                result.update(backend=name, round=r)
                print(json.dumps(result), flush=True)
                out.append(result)
        return out
    finally:
        stop(proc)


def summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for backend in dict.fromkeys(r["backend"] for r in results):
        by = {
            store: [r for r in results if r["backend"] == backend and r["store"] is store]
            for store in (False, True)
        }
        med = {
            store: {
                k: statistics.median(r[k] for r in rs)
                for k in (
                    "preprocessor_us",
                    "database_us",
                    "ttft_p50_ms",
                    "ttft_p99_ms",
                    "req_per_s",
                )
            }
            for store, rs in by.items()
        }
        for store in (False, True):
            row = {"backend": backend, "store": "on" if store else "off", **med[store]}
            row["cpu_ratio"] = (med[store]["preprocessor_us"] + med[store]["database_us"]) / (
                med[False]["preprocessor_us"] + med[False]["database_us"]
            )
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace, load: str) -> str:
    lines = [
        "# Stored responses: store on vs off",
        "",
        f"`python bench/stored.py` — c{args.concurrency}, {args.requests} requests a phase, "
        f"{args.rounds} rounds (medians), {args.words}-word input, {args.tokens} output "
        f"tokens, streamed, mock engine at speedup {args.speedup}. Load average: {load}.",
        "",
        "| backend | store | preprocessor CPU/request | database CPU/request | total vs off "
        "| TTFT p50 | TTFT p99 | requests/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['store']} | {r['preprocessor_us']:.0f} us | "
            f"{r['database_us']:.0f} us | {r['cpu_ratio']:.2f}x | {r['ttft_p50_ms']:.1f} ms | "
            f"{r['ttft_p99_ms']:.1f} ms | {r['req_per_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--words", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--speedup", type=float, default=4.0)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds, args.concurrency = 16, 2, 4
    results: list[dict[str, Any]] = []
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-stored-") as folder:
        if "sqlite" in backends:
            results += run_backend("sqlite", ["--data-dir", folder], None, args)
        if "postgres" in backends:
            with throwaway_postgres(settings=()) as pg:  # default durability
                results += run_backend("postgres", ["--postgres-dsn", pg.dsn], pg, args)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = summary(results)
    text = markdown(rows, args, load)
    print(text)
    if not args.quick:
        args.out_dir.mkdir(exist_ok=True)
        (args.out_dir / "stored.md").write_text(text)
        (args.out_dir / "stored.json").write_text(
            json.dumps({"rows": rows, "phases": results, "load": load}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
