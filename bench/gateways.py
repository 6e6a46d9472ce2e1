"""Switchyard vs the engine floor vs smg, streamed and not, short and long answers.

Runs bench/load.py once (or --repeats times) per configuration (each run starts its own
engines and measures the floor, Switchyard (kv routing) and smg on them, one after another)
and puts the ratios in one table: throughput, TTFT p50/p99, ITL p50/p99 (streamed only) and
the gateway's CPU per request (all its processes) at concurrency 1, 32 and 128. Ratios are
computed within one run; the machine is shared by client, gateways and engines, and two
runs of one configuration can differ by more than a change does (a short phase, 1-2 s at
concurrency 32 and 128, is at the mercy of the moment), hence --repeats: medians of the
runs' ratios.

    python bench/gateways.py               # 4 configurations (streamed/not x 16/256 tokens)
    python bench/gateways.py --quick       # tiny, for a smoke test
    python bench/gateways.py --no-smg      # without smg (no install)
    python bench/gateways.py --repeats 3   # 3 runs each: medians, and the CPU ratio's range
    python bench/gateways.py --configs stream-16,whole-16   # some configurations only

Results: bench/results/gateways.md (+ each run's load.md/load.json under gateways/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOADS = ("c1", "c32", "c128")
# (streamed, output tokens, request scale): long answers get fewer requests per load point.
CONFIGS = ((True, 16, 0.5), (False, 16, 0.5), (True, 256, 0.15), (False, 256, 0.15))


def config_name(stream: bool, tokens: int) -> str:
    return f"{'stream' if stream else 'whole'}-{tokens}"


def run_config(
    stream: bool, tokens: int, scale: float, args: argparse.Namespace, repeat: int = 0
) -> dict:
    out = args.out_dir / "gateways" / config_name(stream, tokens)
    if args.repeats > 1:
        out = out / f"run-{repeat + 1}"
    argv = [sys.executable, str(HERE / "load.py"), "--router-mode", "kv", "--no-plots"]
    argv += ["--max-tokens", str(tokens), "--out-dir", str(out)]
    argv += ["--requests-scale", str(scale * args.scale)]
    if not stream:
        argv.append("--no-stream")
    if args.quick:
        argv.append("--quick")
    if not args.no_smg:
        argv.append("--with-smg")
    started = time.monotonic()
    done = subprocess.run(argv, cwd=HERE.parent, stdout=subprocess.DEVNULL)
    print(
        f"[gateways] {'streamed' if stream else 'whole'} {tokens} tokens, run {repeat + 1}: "
        f"exit {done.returncode} in {time.monotonic() - started:.0f}s",
        file=sys.stderr,
    )
    return json.loads((out / "load.json").read_text())


def _target(run: dict, prefix: str) -> dict[str, Any] | None:
    for target in run["targets"]:
        if target["key"].startswith(prefix) and target["status"] == "ok":
            return target["phases"]
    return None


def cpu_ms_per_request(phase: dict[str, Any] | None) -> float | None:
    if not phase or not phase.get("n"):
        return None
    return sum(phase["cpu"].get("frontend", {}).values()) * 1e3 / phase["n"]


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def quotient(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratio(value: float | None, spread: list[float | None] | None = None) -> str:
    """`1.23x`, with the lowest and highest of the runs' ratios when there are several."""
    if value is None:
        return "-"
    known = sorted(v for v in spread or [] if v is not None)
    if len(known) > 1:
        return f"{value:.2f}x ({known[0]:.2f}-{known[-1]:.2f})"
    return f"{value:.2f}x"


def num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rows(stream: bool, tokens: int, runs: list[dict]) -> list[str]:
    """One row per load: each value the median over the runs; each ratio the median of the
    runs' ratios (each within its own run), the CPU ratio with its range."""
    out = []
    for load in LOADS:
        cells: dict[str, list[float | None]] = {}
        for run in runs:
            floor, sy, smg = (
                (_target(run, prefix) or {}).get(load, {})
                for prefix in ("floor", "switchyard", "smg")
            )
            sy_cpu, smg_cpu = cpu_ms_per_request(sy), cpu_ms_per_request(smg)
            got = {
                "req_s": sy.get("req_s"),
                "vs_floor": quotient(sy.get("req_s"), floor.get("req_s")),
                "vs_smg": quotient(sy.get("req_s"), smg.get("req_s")),
                "ttft": sy.get("ttft_p50"),
                "smg_ttft": smg.get("ttft_p50"),
                "ttft_ratio": quotient(sy.get("ttft_p50"), smg.get("ttft_p50")),
                "ttft99": sy.get("ttft_p99"),
                "smg_ttft99": smg.get("ttft_p99"),
                "itl50": sy.get("itl_p50"),
                "itl99": sy.get("itl_p99"),
                "smg_itl50": smg.get("itl_p50"),
                "smg_itl99": smg.get("itl_p99"),
                "cpu": sy_cpu,
                "smg_cpu": smg_cpu,
                "cpu_ratio": quotient(sy_cpu, smg_cpu),
            }
            for key, value in got.items():
                cells.setdefault(key, []).append(value)
        m = {key: median(values) for key, values in cells.items()}
        itl = (
            f"{num(m['itl50'], 2)}/{num(m['itl99'], 2)} vs "
            f"{num(m['smg_itl50'], 2)}/{num(m['smg_itl99'], 2)}"
            if stream
            else "-"
        )
        out.append(
            f"| {'streamed' if stream else 'whole'} {tokens} | {load} | "
            f"{num(m['req_s'])} | {ratio(m['vs_floor'])} | {ratio(m['vs_smg'])} | "
            f"{num(m['ttft'])} / {num(m['smg_ttft'])} ({ratio(m['ttft_ratio'])}) | "
            f"{num(m['ttft99'])} / {num(m['smg_ttft99'])} | {itl} | "
            f"{num(m['cpu'], 2)} / {num(m['smg_cpu'], 2)} "
            f"({ratio(m['cpu_ratio'], cells['cpu_ratio'])}) |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-smg", action="store_true")
    parser.add_argument("--scale", type=float, default=1.0, help="scale every request count")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="load.py runs per configuration: the table gives medians (CPU: with the range)",
    )
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    names = [config_name(stream, tokens) for stream, tokens, _ in CONFIGS]
    parser.add_argument(
        "--configs",
        default=",".join(names),
        help=f"which configurations, comma-separated (default all: {','.join(names)})",
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(names))
    if unknown or not chosen:
        parser.error(f"unknown --configs {unknown}; known: {','.join(names)}")
    lines = [
        "# Gateways: Switchyard (kv) vs the engine floor vs smg",
        "",
        f"Each configuration is {args.repeats} bench/load.py run(s) (2 SGLang-protocol mock "
        "engines, TTFT 20 ms, ITL 5 ms; closed loop). Each ratio is computed within one run; "
        "with several runs, every cell is the median over them and the CPU ratio shows the "
        "lowest and highest run in brackets. TTFT of a non-streamed request is its whole "
        "latency. CPU = the gateway's processes, all of them, per request.",
        "",
        "| config | load | switchyard req/s | vs floor | vs smg | TTFT p50 ms sy / smg | "
        "TTFT p99 ms sy / smg | ITL p50/p99 ms sy vs smg | CPU ms/req sy / smg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    for stream, tokens, scale in CONFIGS:
        if config_name(stream, tokens) not in chosen:
            continue
        runs = [run_config(stream, tokens, scale, args, k) for k in range(args.repeats)]
        lines += rows(stream, tokens, runs)
    text = "\n".join(lines) + "\n"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "gateways.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
