"""What the preprocessor spends per request, counted rather than timed.

Starts two SGLang-protocol mock engines and `switchyard up` in front of them (as bench/load.py
does), with the preprocessor under a profiler, runs a closed loop of streamed chat completions
(48-word prompts; whole replies with `--no-stream`) and reports per request, over the measured
requests only (after a warm-up):

- callgrind (default): the preprocessor's instructions per request, all its threads, counted
  only while the measured requests run (`callgrind_control -i on/off`; needs valgrind). Under
  valgrind the preprocessor runs ~50x slower and batches more replies per wake-up than at full
  speed: compare checkouts with it (the load average does not change the counts; the rounds
  differ by 1-3% with the batching), not with load.py's CPU numbers.
- `--cprofile`: Python calls per request and the functions with the most own time (cProfile
  of the event loop's thread; its overhead inflates Python-heavy functions).

The profiler is put on the preprocessor (or, with `--service`, the dispatcher or the router)
by a sitecustomize module on PYTHONPATH that acts only in the process started as
`switchyard <service>`.

    python bench/request_cost.py                          # callgrind, 3 rounds of 300
    python bench/request_cost.py --cprofile --requests 1000
    python bench/request_cost.py --no-stream                # non-streamed (whole) replies
    python bench/request_cost.py --service dispatcher       # another service's cost
    /other/checkout/.venv/bin/python bench/request_cost.py  # run from that checkout's folder

Results: bench/results/request_cost.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hotspots import SERVICES, service_pids
from load import MODEL, Processes, served_tokenizer_dir, start_engines, switchyard_stack
from loadgen import closed_run

HERE = Path(__file__).resolve().parent
_ENV = "SWITCHYARD_BENCH_PROFILE"  # "<service>:callgrind:<out file>" or ...:cprofile:...
_SITECUSTOMIZE = """
import os, shutil, sys
_service, _, _how = os.environ.get("SWITCHYARD_BENCH_PROFILE", "").partition(":")
if _how and sys.orig_argv[1:4] == ["-m", "switchyard", _service]:
    _kind, _out = _how.split(":", 1)
    if _kind == "callgrind" and not os.environ.get("SWITCHYARD_BENCH_UNDER_VALGRIND"):
        os.environ["SWITCHYARD_BENCH_UNDER_VALGRIND"] = "1"
        os.execv(shutil.which("valgrind"), ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                 "--callgrind-out-file=" + _out, *sys.orig_argv])
    elif _kind == "cprofile":
        import cProfile, signal
        _on = []
        def _toggle(signum, frame):
            if not _on:
                _on.append(cProfile.Profile())
                _on[0].enable()
            else:
                _on[0].disable()
                _on.pop().dump_stats(_out)
        signal.signal(signal.SIGUSR1, _toggle)
"""


def _callgrind_round(pid: int, out: Path, run: Callable[[], None]) -> int:
    """Instructions of the requests `run` sends."""
    control = shutil.which("callgrind_control") or "callgrind_control"
    subprocess.run([control, "-z", str(pid)], check=True, capture_output=True)
    subprocess.run([control, "-i", "on", str(pid)], check=True, capture_output=True)
    run()
    subprocess.run([control, "-d", str(pid)], check=True, capture_output=True)
    subprocess.run([control, "-i", "off", str(pid)], check=True, capture_output=True)
    total = 0
    for dump in out.parent.glob(out.name + ".*"):
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith("summary:"):
                total += int(line.split()[1])
                break
        dump.unlink()
    return total


def _top(stats: pstats.Stats, n: int, count: int) -> list[str]:
    rows = []
    for (path, line, name), (_, calls, own, inclusive, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = path.split("site-packages/")[-1].split(str(HERE.parent) + "/")[-1]
        rows.append((own, calls, inclusive, f"{where}:{line}({name})"))
    rows.sort(reverse=True)
    out = ["| own us | calls | incl. us | function |", "|---:|---:|---:|---|"]
    for own, calls, inclusive, where in rows[:count]:
        out.append(
            f"| {own / n * 1e6:.1f} | {calls / n:.1f} | {inclusive / n * 1e6:.1f} | {where} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cprofile", action="store_true", help="calls, not instructions")
    parser.add_argument("--requests", type=int, default=300, help="measured per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--no-stream", action="store_true", help="ask for whole replies, not streamed ones"
    )
    parser.add_argument(
        "--service", choices=SERVICES, default="preprocessor", help="the process measured"
    )
    parser.add_argument("--top", type=int, default=30, help="functions listed (--cprofile)")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    if not args.cprofile and shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind), or use --cprofile")
    tmp = Path(tempfile.mkdtemp(prefix="request-cost-"))
    out = tmp / ("profile.prof" if args.cprofile else "callgrind.out")
    (tmp / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    os.environ[_ENV] = f"{args.service}:{'cprofile' if args.cprofile else 'callgrind'}:{out}"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(tmp), os.environ.get("PYTHONPATH")])
    )
    procs = Processes(tmp)
    lines = [
        f"# {args.service.capitalize()} cost per request "
        f"({'cProfile' if args.cprofile else 'callgrind'})",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{'whole (non-streamed)' if args.no_stream else 'streamed'} chat, 48-word prompts, "
        f"--max-tokens {args.max_tokens}, concurrency {args.concurrency}, 2 mock engines, "
        f"router-mode kv; {args.rounds} rounds of {args.requests} requests; load average "
        f"{os.getloadavg()[0]:.1f}.",
        "",
    ]
    try:
        tokenizer, _ = served_tokenizer_dir(tmp / "tokenizer")
        _, _, kv_urls = start_engines(procs, 2, tokenizer, 20.0, 5.0)
        slow = ["--start-timeout", "300", "--request-timeout", "600"]
        with switchyard_stack(procs, "switchyard", kv_urls, "kv", slow) as (base, up):
            pid = service_pids(up.pid)[args.service]

            def run(phase: str, n: int) -> None:
                asyncio.run(
                    closed_run(
                        base, MODEL, args.max_tokens, phase, n, args.concurrency, not args.no_stream
                    )
                )

            run("warm-up", 300)
            for r in range(args.rounds):
                if args.cprofile:
                    os.kill(pid, signal.SIGUSR1)
                    time.sleep(0.2)
                    run(f"round-{r}", args.requests)
                    os.kill(pid, signal.SIGUSR1)
                    time.sleep(1.0)
                    stats = pstats.Stats(str(out))
                    calls = stats.total_calls / args.requests  # type: ignore[attr-defined]
                    lines.append(f"Round {r + 1}: {calls:,.0f} Python calls per request.")
                else:
                    total = _callgrind_round(pid, out, lambda r=r: run(f"round-{r}", args.requests))
                    per = total / args.requests
                    lines.append(f"Round {r + 1}: {per:,.0f} instructions per request.")
                print(lines[-1], flush=True)
            if args.cprofile:
                lines += ["", "Last round, per request:", "", *_top(stats, args.requests, args.top)]
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "request_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[len(lines) - args.top - 2 :]) if args.cprofile else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
