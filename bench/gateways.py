"""Switchyard vs the engine floor vs smg, streamed and not, short and long answers (issue 13).

Runs bench/load.py once per configuration (each run starts its own engines and measures the
floor, Switchyard (kv routing) and smg on them, one after another) and puts the ratios of
every run in one table: throughput, TTFT p50/p99, ITL p50/p99 (streamed only) and the
gateway's CPU per request (all its processes) at concurrency 1, 32 and 128. Ratios are
computed within one run; the machine is shared by client, gateways and engines.

    python bench/gateways.py               # 4 configurations (streamed/not x 16/256 tokens)
    python bench/gateways.py --quick       # tiny, for a smoke test
    python bench/gateways.py --no-smg      # without smg (no install)

Results: bench/results/gateways.md (+ each run's load.md/load.json under gateways/).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOADS = ("c1", "c32", "c128")
# (streamed, output tokens, request scale): long answers get fewer requests per load point.
CONFIGS = ((True, 16, 0.5), (False, 16, 0.5), (True, 256, 0.15), (False, 256, 0.15))


def run_config(stream: bool, tokens: int, scale: float, args: argparse.Namespace) -> dict:
    out = args.out_dir / "gateways" / f"{'stream' if stream else 'whole'}-{tokens}"
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
        f"[gateways] {'streamed' if stream else 'whole'} {tokens} tokens: exit {done.returncode} "
        f"in {time.monotonic() - started:.0f}s",
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


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rows(stream: bool, tokens: int, run: dict) -> list[str]:
    floor, sy, smg = _target(run, "floor"), _target(run, "switchyard"), _target(run, "smg")
    out = []
    for load in LOADS:
        f = (floor or {}).get(load, {})
        s = (sy or {}).get(load, {})
        g = (smg or {}).get(load, {})
        sy_cpu, smg_cpu = cpu_ms_per_request(s), cpu_ms_per_request(g)
        itl = (
            f"{num(s.get('itl_p50'), 2)}/{num(s.get('itl_p99'), 2)} vs "
            f"{num(g.get('itl_p50'), 2)}/{num(g.get('itl_p99'), 2)}"
            if stream
            else "-"
        )
        out.append(
            f"| {'streamed' if stream else 'whole'} {tokens} | {load} | "
            f"{num(s.get('req_s'))} | {ratio(s.get('req_s'), f.get('req_s'))} | "
            f"{ratio(s.get('req_s'), g.get('req_s'))} | "
            f"{num(s.get('ttft_p50'))} / {num(g.get('ttft_p50'))} "
            f"({ratio(s.get('ttft_p50'), g.get('ttft_p50'))}) | "
            f"{num(s.get('ttft_p99'))} / {num(g.get('ttft_p99'))} | {itl} | "
            f"{num(sy_cpu, 2)} / {num(smg_cpu, 2)} ({ratio(sy_cpu, smg_cpu)}) |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-smg", action="store_true")
    parser.add_argument("--scale", type=float, default=1.0, help="scale every request count")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    lines = [
        "# Gateways: Switchyard (kv) vs the engine floor vs smg",
        "",
        "Each configuration is one bench/load.py run (2 SGLang-protocol mock engines, TTFT 20 ms,"
        " ITL 5 ms; closed loop). Ratios are within that run. TTFT of a non-streamed request is "
        "its whole latency. CPU = the gateway's processes, all of them, per request.",
        "",
        "| config | load | switchyard req/s | vs floor | vs smg | TTFT p50 ms sy / smg | "
        "TTFT p99 ms sy / smg | ITL p50/p99 ms sy vs smg | CPU ms/req sy / smg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for stream, tokens, scale in CONFIGS:
        lines += rows(stream, tokens, run_config(stream, tokens, scale, args))
    text = "\n".join(lines) + "\n"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "gateways.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
