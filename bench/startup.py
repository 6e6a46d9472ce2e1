"""How fast each service starts: `switchyard <command>` importing only its own module vs
importing every subcommand's module first (a command line that loads everything).

Two measures per command, the two ways alternated run by run on the same machine:

    parse    wall time of `<command> --version` (interpreter + imports + its parser)
    ready    wall time from the spawn to the ready file (router, dispatcher: bound and about
             to follow fleet; preprocessor: bound and about to serve), for the services
             that write one without any peer running

`eager` runs the same command after `build_parser(full=True)`, which imports every
subcommand's module as the old `switchyard` did on every start.

    python bench/startup.py            # 5 runs each
    python bench/startup.py --quick    # 1 run each, for a smoke test

Results: bench/results/startup.md and .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from switchyard.cli import SUBCOMMANDS
from switchyard.common.ports import read_ready_file

HERE = Path(__file__).resolve().parent
LOCAL = "tcp://127.0.0.1:0"
EAGER = (
    "import sys; from switchyard import cli; cli.build_parser(full=True); "
    "sys.exit(cli.main(sys.argv[1:]))"
)
READY_ARGS = {
    "router": ["--bind", LOCAL, "--metrics-port", "off"],
    "dispatcher": ["--bind", LOCAL, "--metrics-port", "off"],
    "preprocessor": ["--port", "0"],
}


def command(way: str, argv: list[str]) -> list[str]:
    if way == "lazy":
        return [sys.executable, "-m", "switchyard", *argv]
    return [sys.executable, "-c", EAGER, *argv]


def parse_time(way: str, name: str) -> float:
    start = time.perf_counter()
    subprocess.run(command(way, [name, "--version"]), check=True, capture_output=True)
    return time.perf_counter() - start


def ready_time(way: str, name: str) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as folder:
        ready = Path(folder) / "ready.json"
        argv = [name, *READY_ARGS[name], "--log-level", "WARNING", "--ready-file", str(ready)]
        start = time.perf_counter()
        proc = subprocess.Popen(
            command(way, argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            read_ready_file(ready, proc, 60.0)
            return time.perf_counter() - start
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    for name in SUBCOMMANDS:
        measures = {"parse": parse_time}
        if name in READY_ARGS:
            measures["ready"] = ready_time
        for measure, fn in measures.items():
            times: dict[str, list[float]] = {"eager": [], "lazy": []}
            for n in range(runs):
                for way in ("eager", "lazy") if n % 2 == 0 else ("lazy", "eager"):
                    times[way].append(fn(way, name))
            results.setdefault(name, {})[measure] = times
    lines = [
        "# Service start-up: lazy subcommand imports vs every module imported first",
        "",
        f"Median of {runs} runs each, alternated (seconds; the machine may be shared: compare "
        "within a row). `eager` imports every subcommand's module first, as `switchyard` did "
        "before; `lazy` imports only the command's own.",
        "",
        "| command | measure | eager s | lazy s | lazy / eager |",
        "|---|---|---|---|---|",
    ]
    for name, by_measure in results.items():
        for measure, measured in by_measure.items():
            eager, lazy = statistics.median(measured["eager"]), statistics.median(measured["lazy"])
            lines.append(f"| {name} | {measure} | {eager:.3f} | {lazy:.3f} | {lazy / eager:.2f} |")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "startup.md").write_text("\n".join(lines) + "\n")
    (args.out_dir / "startup.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
