"""Flow control under overload: fairness between tenants, priorities, shedding by objective.

`switchyard up` on two mock engines whose simulated timing makes capacity small and well
defined (every request a stream of --max-tokens tokens: --ttft-ms to the first, then
--itl-ms per token, slower the fuller the batch), with a flow config of max_running SLOTS
(burst SLOTS/2, equal weights, classes interactive/batch, tenants by header). Capacity R is
measured first: SLOTS closed-loop clients, completed requests per second. Then, per phase,
Poisson arrivals for --seconds (open loop: a 429 is not retried):

  steady solo           tenant `steady` at 0.3 R
  steady + flood        `steady` at 0.3 R beside tenant `flood` at 5 R
  interactive solo      tenant `ui` at 0.3 R, x-priority: interactive
  interactive + batch   `ui` at 0.3 R beside tenant `batch` at 5 R, x-priority: batch
  objective             tenant `slo` at 3 R, each with x-ttft-objective-ms --objective-ms
  no objective          the same load without it: what serving late looks like

and, as the reference, steady + flood on a stack without flow control (per-process first
come first served admission: --max-concurrent-requests SLOTS, --max-queued-requests
4 x SLOTS). The phases repeat --repeats times on the same stacks.

Per phase and tenant: offered rate, the share of its requests completed (its goodput against
what it offered), served rate (completions per second over the phase and the drain of what
it queued: the capacity it got), 429s (each with Retry-After), other failures, TTFT p50/p99
of the completed requests as the client sees them; for objectives, the share of completed
requests whose first token came after the objective, and how soon the refusals came. The
targets (issue 37): steady's TTFT p99 beside the flood within 1.5x of solo and its goodput
unchanged, the flood getting the rest; interactive's TTFT p99 beside the batch flow within
1.5x of solo; under 5% of the admitted requests with an objective missing it.

One run, one machine (shared: compare phases within the run, not runs).

    python bench/flow.py                    # 60 s phases, 2 repeats
    python bench/flow.py --seconds 20 --repeats 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from harness import pct, started, stop, wait_ready
from overload import Reply, read_stream, target_of

HERE = Path(__file__).resolve().parent
MODEL = "deepseek-mock"
TENANTS = ("steady", "flood", "ui", "batch", "slo")
_WAIT = "switchyard_preprocessor_flow_wait_seconds"
_FLOW_LABEL = re.compile(r'flow="([^"]*)"')


@dataclass
class Load:
    """One tenant's offered load in a phase."""

    tenant: str
    rate: float  # requests per second
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Stats:
    offered: int = 0
    completed: int = 0
    limited: int = 0
    retry_after_missing: int = 0
    failed: int = 0
    first_failure: str = ""
    codes: Counter[str] = field(default_factory=Counter)
    ttfts: list[float] = field(default_factory=list)
    refused_after: list[float] = field(default_factory=list)  # seconds until the 429
    elapsed: float = 0.0  # the phase's arrivals and the drain of what it queued

    def row(self, seconds: float, objective_s: float = 0.0) -> dict[str, object]:
        out: dict[str, object] = {
            "offered_per_s": round(self.offered / seconds, 2),
            "goodput_req_s": round(self.completed / seconds, 2),
            "completed": self.completed,
            "completed_share": round(self.completed / self.offered, 4) if self.offered else None,
            "limited": self.limited,
            "retry_after_missing": self.retry_after_missing,
            "failed": self.failed,
            "first_failure": self.first_failure,
            "codes": dict(self.codes),
            "ttft_p50_ms": round(pct(self.ttfts, 0.5) * 1e3, 1) if self.ttfts else None,
            "ttft_p99_ms": round(pct(self.ttfts, 0.99) * 1e3, 1) if self.ttfts else None,
            # Completions over the whole phase, drain included: the capacity a tenant got.
            "served_req_s": round(self.completed / self.elapsed, 2) if self.elapsed else None,
        }
        if objective_s:
            late = sum(1 for t in self.ttfts if t > objective_s)
            out["missed_objective"] = round(late / len(self.ttfts), 4) if self.ttfts else None
        if self.refused_after:
            out["refused_p50_ms"] = round(pct(self.refused_after, 0.5) * 1e3, 1)
            out["refused_p99_ms"] = round(pct(self.refused_after, 0.99) * 1e3, 1)
        return out


async def one(target: tuple[str, int], n: int, load: Load, max_tokens: int, stats: Stats) -> None:
    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{load.tenant} {n}: a shunting plan"}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    )
    extra = "".join(f"{k}: {v}\r\n" for k, v in load.headers.items())
    t0 = time.perf_counter()
    reply = None
    try:
        reply = await Reply.post(*target, "/v1/chat/completions", body, extra)
        if reply.status == 429:
            stats.limited += 1
            stats.refused_after.append(time.perf_counter() - t0)
            if not reply.headers.get("retry-after"):
                stats.retry_after_missing += 1
            text = b"".join([line.encode() async for line in reply.lines()])
            with_code = orjson.loads(text).get("error", {}).get("code", "") if text else ""
            stats.codes[with_code] += 1
            return
        if reply.status != 200:
            stats.failed += 1
            stats.first_failure = stats.first_failure or str(reply.status)
            return
        first, tokens, error = await read_stream(reply, t0)
        if error is not None:
            stats.failed += 1
            stats.first_failure = stats.first_failure or error
            return
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        stats.failed += 1
        stats.first_failure = stats.first_failure or repr(exc)
        return
    finally:
        if reply is not None:
            reply.close()
    if tokens != max_tokens or first is None:
        stats.failed += 1
        stats.first_failure = stats.first_failure or f"{tokens} of {max_tokens} tokens"
        return
    stats.completed += 1
    stats.ttfts.append(first)


async def phase(
    base: str, loads: list[Load], seconds: float, max_tokens: int, seed: int
) -> dict[str, Stats]:
    """Poisson arrivals per tenant for `seconds`; waits for every request to end."""
    target = target_of(base)
    loop = asyncio.get_running_loop()
    stats = {load.tenant: Stats() for load in loads}
    tasks: list[asyncio.Task[None]] = []
    start = loop.time()

    async def arrivals(load: Load, rng: random.Random) -> None:
        end = loop.time() + seconds
        at = loop.time()
        n = 0
        while True:
            at += rng.expovariate(load.rate)
            if at >= end:
                return
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            n += 1
            stats[load.tenant].offered += 1
            tasks.append(asyncio.create_task(one(target, n, load, max_tokens, stats[load.tenant])))

    await asyncio.gather(
        *(arrivals(load, random.Random(seed * 101 + i)) for i, load in enumerate(loads))
    )
    await asyncio.gather(*tasks)
    for s in stats.values():
        s.elapsed = loop.time() - start
    return stats


async def capacity(base: str, slots: int, seconds: float, max_tokens: int) -> float:
    """Completed requests per second with `slots` clients back to back."""
    probe = Stats()
    target = target_of(base)
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    load = Load("capacity", 0.0)

    async def client(k: int) -> None:
        n = 0
        while loop.time() < end:
            await one(target, k * 100_000 + n, load, max_tokens, probe)
            n += 1

    t0 = loop.time()
    await asyncio.gather(*(client(k) for k in range(slots)))
    if probe.failed or not probe.completed:
        raise RuntimeError(f"capacity run failed: {probe.first_failure or 'nothing completed'}")
    return probe.completed / (loop.time() - t0)


def flow_file(folder: Path, slots: int, share_window_s: float = 10.0) -> Path:
    path = folder / "flow.json"
    config = {
        "max_running": slots,
        "burst": slots // 2,
        "max_queued": 4 * slots,
        "queue_timeout_s": 10,
        "share_window_s": share_window_s,
        "tenant_header": "x-tenant",
        "classes": {"interactive": -10, "batch": 10},
        # Named, so the metrics carry each tenant's label (equal weights).
        "flows": {tenant: {} for tenant in TENANTS},
    }
    path.write_text(json.dumps(config))
    return path


def up(args: argparse.Namespace, *extra: str):
    proc, report = started(
        "up", "--http-port", "0", "--log-level", "WARNING",
        "--mock-engines", "sglang,vllm", "--mock-itl-ms", str(args.itl_ms),
        "--mock-ttft-ms", str(args.ttft_ms), *extra,
        timeout=120, start_new_session=True,
    )  # fmt: skip
    wait_ready(report["base_url"], proc)
    return proc, report["base_url"]


def phases(r: float, objective_ms: float) -> list[tuple[str, list[Load]]]:
    steady = Load("steady", 0.3 * r, {"x-tenant": "steady"})
    ui = Load("ui", 0.3 * r, {"x-tenant": "ui", "x-priority": "interactive"})
    objective = {"x-tenant": "slo", "x-ttft-objective-ms": f"{objective_ms:g}"}
    return [
        ("steady solo", [steady]),
        ("steady + flood", [steady, Load("flood", 5 * r, {"x-tenant": "flood"})]),
        ("interactive solo", [ui]),
        (
            "interactive + batch",
            [ui, Load("batch", 5 * r, {"x-tenant": "batch", "x-priority": "batch"})],
        ),
        ("objective", [Load("slo", 3 * r, objective)]),
        ("no objective", [Load("slo", 3 * r, {"x-tenant": "slo"})]),
    ]


def gate_waits(base: str) -> dict[str, tuple[float, float]]:
    """Per flow label: (seconds, requests) the admitted requests waited for the flow gate,
    as the preprocessor counts them (empty without flow control)."""
    text = httpx.get(base + "/metrics", timeout=10).text
    out: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        for suffix, index in (("_sum{", 0), ("_count{", 1)):
            if line.startswith(_WAIT + suffix):
                found = _FLOW_LABEL.search(line)
                if found is None:
                    continue
                pair = list(out.get(found.group(1), (0.0, 0.0)))
                pair[index] += float(line.rsplit(" ", 1)[1])
                out[found.group(1)] = (pair[0], pair[1])
    return out


def run_phases(
    base: str, plan: list[tuple[str, list[Load]]], args: argparse.Namespace, seed: int
) -> list[dict[str, object]]:
    out = []
    for i, (name, loads) in enumerate(plan):
        load_before = os.getloadavg()[0]
        waits_before = gate_waits(base)
        stats = asyncio.run(phase(base, loads, args.seconds, args.max_tokens, seed + i))
        waits = gate_waits(base)
        objective = args.objective_ms / 1e3 if name == "objective" else 0.0
        for load in loads:
            row = {
                "phase": name,
                "tenant": load.tenant,
                **stats[load.tenant].row(args.seconds, objective),
            }
            # The mean wait at the gate of its admitted requests (the rest of its TTFT is
            # the route, the engine and the processes' share of the shared CPU).
            seconds, count = waits.get(load.tenant, (0.0, 0.0))
            seconds0, count0 = waits_before.get(load.tenant, (0.0, 0.0))
            row["gate_wait_ms"] = (
                round((seconds - seconds0) / (count - count0) * 1e3, 1) if count > count0 else None
            )
            row["load_avg"] = round((load_before + os.getloadavg()[0]) / 2, 2)
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def find(rows: list[dict[str, object]], phase: str, tenant: str) -> dict[str, object]:
    return next(r for r in rows if r["phase"] == phase and r["tenant"] == tenant)


def verdicts(rows: list[dict[str, object]], r: float) -> dict[str, float]:
    """The targets' numbers of one repeat."""

    def p99(phase: str, tenant: str) -> float:
        return float(find(rows, phase, tenant)["ttft_p99_ms"] or 0.0)

    def served(phase: str, tenant: str) -> float:
        return float(find(rows, phase, tenant)["served_req_s"] or 0.0)

    def completed(phase: str, tenant: str) -> float:
        return float(find(rows, phase, tenant)["completed_share"] or 0.0)

    fifo = any(x["phase"] == "fifo: steady + flood" for x in rows)
    solo = p99("steady solo", "steady")
    return {
        "steady_p99_ratio": p99("steady + flood", "steady") / solo,
        # Goodput: the share of its requests a tenant got served, beside the flood / solo.
        "steady_goodput_ratio": completed("steady + flood", "steady")
        / completed("steady solo", "steady"),
        "flood_share_of_capacity": served("steady + flood", "flood") / r,
        "ui_p99_ratio": p99("interactive + batch", "ui") / p99("interactive solo", "ui"),
        "ui_goodput_ratio": completed("interactive + batch", "ui")
        / completed("interactive solo", "ui"),
        "batch_share_of_capacity": served("interactive + batch", "batch") / r,
        "missed_objective": float(find(rows, "objective", "slo")["missed_objective"] or 0.0),
        "objective_served_ratio": served("objective", "slo") / r,
        "fifo_steady_p99_ratio": p99("fifo: steady + flood", "steady") / solo
        if fifo
        else float("nan"),
    }


def table(rows: list[dict[str, object]], header: str) -> str:
    lines = [
        header,
        "",
        "| repeat | phase | tenant | offered/s | completed | served req/s | 429 | other failures "
        "| TTFT p50 ms | TTFT p99 ms | gate wait ms (mean) | missed objective "
        "| 429 after (p50 / p99 ms) | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        missed = r.get("missed_objective")
        missed_text = "-" if missed is None else f"{missed:.1%}"
        refused = f"{r['refused_p50_ms']} / {r['refused_p99_ms']}" if "refused_p50_ms" in r else "-"
        wait = "-" if r["gate_wait_ms"] is None else r["gate_wait_ms"]
        lines.append(
            f"| {r['repeat']} | {r['phase']} | {r['tenant']} | {r['offered_per_s']} | "
            f"{r['completed_share']:.1%} | {r['served_req_s']} | {r['limited']} | {r['failed']} | "
            f"{r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {wait} | {missed_text} | {refused} | "
            f"{r['load_avg']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=16, help="the flow config's max_running")
    parser.add_argument("--seconds", type=float, default=60.0, help="per phase")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--itl-ms", type=float, default=15.0, help="the mock engines' pace")
    parser.add_argument("--ttft-ms", type=float, default=100.0, help="the mock engines' TTFT")
    parser.add_argument("--objective-ms", type=float, default=1000.0)
    parser.add_argument(
        "--share-window-s", type=float, default=10.0, help="the flow config's share_window_s"
    )
    parser.add_argument(
        "--phases", default="", help="only the phases whose names contain one of these (comma)"
    )
    parser.add_argument("--no-fifo", action="store_true", help="skip the reference stack")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "flow.md")
    parser.add_argument("--seed", type=int, default=37)
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-flow-") as folder:
        path = flow_file(Path(folder), args.slots, args.share_window_s)
        proc, base = up(args, "--flow-config", str(path))
        try:
            r = asyncio.run(capacity(base, args.slots, args.seconds / 2, args.max_tokens))
            print(json.dumps({"capacity_req_s": round(r, 2)}), flush=True)
            plan = phases(r, args.objective_ms)
            if args.phases:
                wanted = args.phases.split(",")
                plan = [(n, loads) for n, loads in plan if any(w in n for w in wanted)]
            for k in range(args.repeats):
                for row in run_phases(base, plan, args, args.seed + 10 * k):
                    rows.append({"repeat": k + 1, **row})
        finally:
            stop(proc)
    if not args.no_fifo:
        proc, base = up(
            args,
            "--max-concurrent-requests", str(args.slots),
            "--max-queued-requests", str(4 * args.slots),
            "--queue-timeout", "10",
        )  # fmt: skip
        try:
            plan = [("fifo: steady + flood", phases(r, args.objective_ms)[1][1])]
            for k in range(args.repeats):
                for row in run_phases(base, plan, args, args.seed + 10 * k):
                    rows.append({"repeat": k + 1, **row})
        finally:
            stop(proc)
    per_repeat = [  # the targets need every phase
        verdicts([x for x in rows if x["repeat"] == k + 1], r)
        for k in range(args.repeats)
        if not args.phases
    ]
    summary = {
        key: round(statistics.median(v[key] for v in per_repeat), 3)
        for key in (per_repeat[0] if per_repeat else ())
    }
    header = (
        f"Flow control against `switchyard up` (2 mock engines: TTFT {args.ttft_ms:g} ms, "
        f"{args.itl_ms:g} ms/token, {args.max_tokens}-token streams), flow config max_running "
        f"{args.slots}, burst {args.slots // 2}, max_queued {4 * args.slots}, share_window_s "
        f"{args.share_window_s:g}, equal weights. "
        f"Capacity measured first: {r:.2f} completed requests/s with {args.slots} closed-loop "
        f"clients; each phase offers Poisson arrivals for {args.seconds:g} s (objective "
        f"{args.objective_ms:g} ms). `fifo`: the same load on a stack without flow control "
        f"(--max-concurrent-requests {args.slots}, --max-queued-requests {4 * args.slots}). "
        f"Medians over {args.repeats} repeats: {json.dumps(summary)}. One run on one machine "
        "(shared: compare phases, not runs)."
    )
    text = table(rows, header)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "capacity_req_s": r,
                "args": vars(args) | {"out": str(args.out)},
                "summary": summary,
                "repeats": per_repeat,
                "rows": rows,
            },
            indent=1,
        )
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
