"""The hops between Switchyard's processes, measured variant against variant in one run.

Three sections, each a set of A/B pairs: every variant runs side by side with the section's
baseline, both at the same time in fresh child processes, so both meet the same load on the
machine; each pair gives one ratio, and the report lists every pair and the median:

  grpc   the dispatcher's hop to an engine: client CPU of unary-stream Generate calls (grpc.aio,
         the sync stub in threads, channel options) against the SGLang-protocol mock engine
         with zero delays (hops_grpc.py)
  zmq    DEALER <-> ROUTER on one host: ipc:// vs tcp://, I/O threads, LoopSocket vs
         zmq.asyncio; ping-pong and one-request-N-replies streams (hops_zmq.py)
  route  the preprocessor -> router -> preprocessor round trip with the real RouterClient and
         a real router process (hops_route.py)
  stack  router, dispatcher and preprocessor wired over tcp:// or over ipc://, under a closed
         loop of streamed chat completions (hops_stack.py)

CPU is each process's own CPU time (getrusage of every thread), which holds up when other load
shares the machine; wall-clock latencies are secondary. Read ratios within a run.

    python bench/hops.py                              # every section (tens of minutes)
    python bench/hops.py grpc --concurrency 1,32      # one section, some load points
    python bench/hops.py grpc --variants aio,sync-st --rounds 5
    python bench/hops.py --quick                      # a tiny configuration (smoke test)
    python bench/hops.py grpc --variants aio-ref,aio --ref-python ../main/.venv/bin/python

Results: bench/results/hops.md and hops.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
Metrics = dict[str, float]


class Job(Protocol):
    """A measurement in child processes: warm up, wait for go(), measure; result() waits."""

    def warmed(self) -> None: ...

    def go(self) -> None: ...

    def result(self) -> Metrics: ...


@dataclass
class Comparison:
    """One load point of one section: pairs (baseline, variant) run at the same time."""

    section: str
    point: str  # e.g. "c=32 tokens=16"
    baseline: str
    metrics: list[str]  # the first is the one ratios are reported for
    pairs: dict[str, list[tuple[Metrics, Metrics]]] = field(default_factory=dict)

    def ratios(self, variant: str, metric: str) -> list[float]:
        return [v[metric] / b[metric] for b, v in self.pairs.get(variant, []) if b[metric]]

    def values(self, variant: str, metric: str) -> list[float]:
        if variant == self.baseline:
            return [b[metric] for pairs in self.pairs.values() for b, _ in pairs]
        return [v[metric] for _, v in self.pairs.get(variant, [])]


def run_pairs(
    comparison: Comparison,
    variants: Sequence[str],
    rounds: int,
    launch: Callable[[str], Job],
    progress: Callable[[str], None],
) -> Comparison:
    """Each round runs every variant side by side with the baseline, both at once: both see the
    same load on the machine, so their ratio holds up where back-to-back runs drift apart."""
    baseline = comparison.baseline
    first = comparison.metrics[0]
    for index in range(rounds):
        for variant in variants:
            if variant == baseline:
                continue
            # Alternate which one starts first.
            names = [baseline, variant] if index % 2 == 0 else [variant, baseline]
            jobs = {name: launch(name) for name in names}
            for job in jobs.values():
                job.warmed()
            for job in jobs.values():
                job.go()
            got = {name: job.result() for name, job in jobs.items()}
            comparison.pairs.setdefault(variant, []).append((got[baseline], got[variant]))
            progress(
                f"[{comparison.section}] {comparison.point} round {index + 1}/{rounds} "
                f"{variant} vs {baseline}: {first} {got[variant][first]:.4g} / "
                f"{got[baseline][first]:.4g} = {got[variant][first] / got[baseline][first]:.2f}"
            )
    return comparison


class ChildJob:
    """python <argv> from bench/: it prints "warm" when warmed up, measures after a line on its
    stdin, and prints its JSON result as the last line of its output."""

    def __init__(
        self, argv: list[str], env: dict[str, str] | None = None, python: str | None = None
    ) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(
            [python or sys.executable, *argv], cwd=HERE, env=env, text=True, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def warmed(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "warm":
            self.proc.kill()
            _, err = self.proc.communicate()
            raise RuntimeError(f"child {self.argv[:3]} failed before its run: {err[-2000:]}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def output(self, timeout: float = 900) -> Any:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise RuntimeError(f"child {self.argv[:3]} timed out") from None
        if self.proc.returncode != 0:
            raise RuntimeError(f"child {self.argv[:3]} failed: {err[-2000:]}")
        return json.loads(out.strip().splitlines()[-1])


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def markdown(comparisons: list[Comparison], notes: dict[str, list[str]], header: str) -> str:
    lines = [header, ""]
    sections: list[str] = []
    for c in comparisons:
        if c.section not in sections:
            sections.append(c.section)
    for section in sections:
        lines += [f"## {section}", ""]
        lines += notes.get(section, [])
        for c in (c for c in comparisons if c.section == section):
            # Ratios to the baseline run beside it, for CPU and for wake-ups.
            keyed = [c.metrics[0]] + [m for m in c.metrics[1:] if m.startswith("wakeups")]
            rounds = max((len(p) for p in c.pairs.values()), default=0)
            lines += [
                f"### {c.point} (baseline {c.baseline}, {rounds} pairs per variant)",
                "",
                "| variant | " + " | ".join(c.metrics)
                + "".join(f" | {m} / baseline: median | each pair" for m in keyed) + " |",
                "|---" * (len(c.metrics) + 1 + 2 * len(keyed)) + "|",
            ]  # fmt: skip
            for variant in [c.baseline, *c.pairs]:
                cells = [_fmt(statistics.median(c.values(variant, m))) for m in c.metrics]
                for m in keyed:
                    ratios = c.ratios(variant, m)
                    cells.append(f"**{statistics.median(ratios):.2f}x**" if ratios else "1")
                    cells.append(" ".join(f"{r:.2f}" for r in ratios))
                lines.append(f"| {variant} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import hops_grpc
    import hops_route
    import hops_stack
    import hops_zmq

    sections = {"grpc": hops_grpc, "zmq": hops_zmq, "route": hops_route, "stack": hops_stack}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", choices=[*sections, []], default=[])
    parser.add_argument("--quick", action="store_true", help="a tiny configuration")
    parser.add_argument("--rounds", type=int, default=None, help="A/B rounds per load point")
    parser.add_argument("--concurrency", default=None, help="comma-separated, per section")
    parser.add_argument("--variants", default=None, help="comma-separated (one section only)")
    parser.add_argument("--tokens", default=None, help="comma-separated replies per stream")
    parser.add_argument("--seconds", type=float, default=None, help="length of each measured run")
    parser.add_argument(
        "--busy-us", type=float, default=0.0, help="route: the client's loop's other work (us)"
    )
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    parser.add_argument(
        "--ref-python",
        default=None,
        help="interpreter of another checkout's venv (e.g. main's): the `*-ref` variants run "
        "that checkout's code, for a before/after in one run",
    )
    args = parser.parse_args(argv)
    chosen = args.sections or list(sections)
    if args.variants and len(set(args.variants.split(","))) < 2:
        # The first variant is the baseline every other one runs beside: alone, nothing runs.
        parser.error("--variants needs a baseline and at least one variant to run beside it")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    comparisons: list[Comparison] = []
    notes: dict[str, list[str]] = {}
    started = time.time()
    for name in chosen:
        module = sections[name]
        done, section_notes = module.run(args, progress)
        comparisons += done
        notes[name] = section_notes
    header = (
        f"# Hops: variant against variant\n\n{time.strftime('%Y-%m-%d %H:%M')}, "
        f"{platform.node()}, python {platform.python_version()}, {time.time() - started:.0f} s. "
        "Values are medians over the runs; CPU is each process's own CPU time (getrusage), "
        "wake-ups its voluntary context switches. The machine may be shared: read the ratios "
        "(each from a variant and the baseline run at the same time), not absolute numbers."
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    text = markdown(comparisons, notes, header)
    (args.out_dir / "hops.md").write_text(text)
    (args.out_dir / "hops.json").write_text(json.dumps([c.__dict__ for c in comparisons], indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())


async def wait_go() -> None:
    """In a child: say "warm" and wait for the parent's go (a line on stdin)."""
    print("warm", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
