"""Where the preprocessor's time goes, stage by stage, and what a long conversation costs to
tokenize turn by turn.

1. Stages: 2 SGLang-protocol mock engines, `switchyard up --preprocessor-arg=--stage-timing`,
   closed-loop load (streamed and not); the preprocessor's switchyard_preprocessor_stage_seconds
   sums are read before and after each run, next to the CPU seconds of every process, and
   reported per request (microseconds) and as a share of the preprocessor's CPU. The rest of
   the preprocessor's CPU is outside the stages: HTTP parsing (uvicorn), the event loop, the
   ZMQ readers. For streamed runs, where the TTFT goes (means): as the client sees it, as the
   preprocessor sees it (from its handler's start to the first token's frames), and the
   engine's own (at the dispatcher, from its Generate to the first token). Client minus
   preprocessor is the HTTP hop both ways (and each side's wait for a CPU); preprocessor minus
   engine minus the stages before it is the two ZMQ hops through the dispatcher.
2. Multi-turn tokenization: one conversation grown turn by turn to ~32k tokens; each turn's
   prompt rendered and tokenized as the preprocessor does (cached segments) vs a full encode of
   the same text, in this process.

    python bench/stages.py            # both parts
    python bench/stages.py --quick    # tiny, for a smoke test
    python bench/stages.py --concurrency 1,32 --no-conversation   # two load points, part 1

The stack is this interpreter's switchyard: run the script with another checkout's venv
python (e.g. /work/main/.venv/bin/python bench/stages.py) to measure that checkout's code.

Results: bench/results/stages.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
from load import MODEL, Processes, served_tokenizer_dir, start_engines, switchyard_stack
from loadgen import closed_run
from procstat import CpuMeter

from switchyard.preprocessor.stages.timing import STAGES
from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir

HERE = Path(__file__).resolve().parent
_SERIES = re.compile(r'^switchyard_preprocessor_stage_seconds_(sum|count)\{stage="(\w+)"\} (\S+)$')
_TTFT = {  # where the first token is timed -> its histogram
    "preprocessor": "switchyard_preprocessor_time_to_first_token_seconds",
    "engine": "switchyard_dispatcher_engine_time_to_first_token_seconds",
}
_BUCKET = re.compile(
    r'^switchyard_preprocessor_stage_seconds_bucket\{le="([^"]+)",stage="(\w+)"\} (\S+)$'
)
# The stage whose wall time is also given as percentiles (from the histogram's buckets).
WALL_STAGE = "route"


def stage_sums(base: str) -> dict[str, tuple[float, float]]:
    """stage -> (seconds, observations) from the preprocessor's /metrics."""
    return _scrape(base)[0]


def _scrape(
    base: str,
) -> tuple[dict[str, tuple[float, float]], dict[str, list[tuple[float, float]]]]:
    """(stage -> (seconds, observations), stage -> cumulative buckets [(le, count)])."""
    out: dict[str, list[float]] = {}
    buckets: dict[str, list[tuple[float, float]]] = {}
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        match = _SERIES.match(line)
        if match:
            kind, stage, value = match.groups()
            out.setdefault(stage, [0.0, 0.0])[0 if kind == "sum" else 1] = float(value)
            continue
        match = _BUCKET.match(line)
        if match:
            le, stage, count = match.groups()
            buckets.setdefault(stage, []).append((float(le), float(count)))
    sums = {stage: (v[0], v[1]) for stage, v in out.items()}
    return sums, {stage: sorted(b) for stage, b in buckets.items()}


def histogram_total(url: str, name: str) -> tuple[float, float]:
    """(seconds, observations) of one histogram, summed over its label sets."""
    total = [0.0, 0.0]
    for line in httpx.get(url, timeout=10).text.splitlines():
        for i, suffix in enumerate(("_sum", "_count")):
            if line.startswith(name + suffix):
                total[i] += float(line.rsplit(" ", 1)[1])
    return total[0], total[1]


def ttft_totals(urls: dict[str, str]) -> dict[str, tuple[float, float]]:
    """where -> (seconds, observations) of the first-token histograms."""
    return {where: histogram_total(urls[where], _TTFT[where]) for where in _TTFT}


def mean_ms(before: tuple[float, float], after: tuple[float, float]) -> str:
    count = after[1] - before[1]
    return f"{(after[0] - before[0]) / count * 1e3:.1f}" if count > 0 else "-"


def bucket_quantile(
    before: list[tuple[float, float]], after: list[tuple[float, float]], q: float
) -> float:
    """The q-quantile of the observations between two scrapes of one histogram series,
    interpolated linearly inside its bucket (Prometheus' histogram_quantile)."""
    counts = dict(before)
    cumulative = [(le, n - counts.get(le, 0.0)) for le, n in after]
    total = cumulative[-1][1] if cumulative else 0.0
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for le, n in cumulative:
        if n >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(n - below, 1e-12)
        lower, below = le, n
    return lower


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def load_run(base: str, stream: bool, n: int, concurrency: int, tokens: int) -> list[float]:
    """The TTFTs (seconds) of a closed-loop run."""
    phase = f"{stream}-{concurrency}"
    samples, _ = await closed_run(base, MODEL, tokens, phase, n, concurrency, stream)
    return [s.ttft for s in samples]


def requests_at(args: argparse.Namespace, concurrency: int) -> int:
    """`--requests` at the highest concurrency; lower ones run proportionally fewer (at least
    150), so each run takes about as long."""
    top = max(args.concurrencies)
    return max(min(args.requests, 150), args.requests * concurrency // top)


def stage_table(args: argparse.Namespace) -> list[str]:
    tmp = Path(tempfile.mkdtemp(prefix="switchyard-stages-"))
    procs = Processes(tmp)
    lines = [
        "## Per-stage time in the preprocessor (`--stage-timing`)",
        "",
        f"2 mock engines (TTFT 20 ms, ITL 5 ms), {args.tokens} output tokens, closed loop at "
        f"concurrency {', '.join(map(str, args.concurrencies))} "
        f"({', '.join(str(requests_at(args, c)) for c in args.concurrencies)} requests per "
        "run). us/request (mean); `stream` = detokenize + stop strings + framing of every "
        "batch of replies, `write` = handing the frames to uvicorn; route waits for the router "
        "process (wall time), its p50/p99 interpolated in the stage histogram's buckets; TTFT "
        "as the client sees it, then (means, streamed runs: a whole reply has no first token) "
        "as the preprocessor sees it (handler start to first frames) and the engine's own (the "
        "dispatcher's Generate to its first token).",
        "",
    ]
    try:
        tokenizer, _ = served_tokenizer_dir(tmp / "tokenizer")
        engines, _, kv_urls = start_engines(procs, 2, tokenizer, 20.0, 5.0)
        extra = ["--preprocessor-arg=--stage-timing"]
        with switchyard_stack(procs, "switchyard", kv_urls, "kv", extra) as (base, proc):
            children = json.loads((procs.log_dir / "switchyard.json").read_text())["children"]
            urls = {
                "preprocessor": base + "/metrics",
                "engine": f"http://127.0.0.1:{children['dispatcher-0']['metrics_port']}/metrics",
            }
            meter = CpuMeter({"frontend": [proc.pid]})
            asyncio.run(load_run(base, True, min(64, args.requests), max(args.concurrencies), 8))
            header = (
                "| run | c | " + " | ".join(STAGES) + " | stages total | preprocessor CPU | "
                f"{WALL_STAGE} p50 | {WALL_STAGE} p99 | TTFT p50 ms | TTFT p99 ms | TTFT mean ms "
                "| in the preprocessor | at the engine |"
            )
            lines += [header, "|" + "---|" * (len(STAGES) + 12)]
            cpu_lines: list[str] = []
            for concurrency in args.concurrencies:
                n = requests_at(args, concurrency)
                for stream in (True, False):
                    (before, hist0), cpu0 = _scrape(base), meter.snapshot()
                    first0 = ttft_totals(urls)
                    ttfts = asyncio.run(load_run(base, stream, n, concurrency, args.tokens))
                    (after, hist1), cpu1 = _scrape(base), meter.snapshot()
                    first1 = ttft_totals(urls)
                    per_process = meter.diff(cpu0, cpu1)["frontend"]
                    pre_cpu = sum(v for k, v in per_process.items() if k.startswith("preprocessor"))
                    cells, total = [], 0.0
                    for stage in STAGES:
                        spent = after.get(stage, (0, 0))[0] - before.get(stage, (0, 0))[0]
                        total += spent
                        cells.append(f"{spent / n * 1e6:.0f}")
                    wall0, wall1 = hist0.get(WALL_STAGE, []), hist1.get(WALL_STAGE, [])
                    lines.append(
                        f"| {'streamed' if stream else 'whole'} | {concurrency} | "
                        + " | ".join(cells)
                        + f" | {total / n * 1e6:.0f} | {pre_cpu / n * 1e6:.0f} | "
                        f"{bucket_quantile(wall0, wall1, 0.5) * 1e6:.0f} | "
                        f"{bucket_quantile(wall0, wall1, 0.99) * 1e6:.0f} | "
                        f"{pct(ttfts, 0.5) * 1e3:.1f} | {pct(ttfts, 0.99) * 1e3:.1f} | "
                        f"{sum(ttfts) / len(ttfts) * 1e3:.1f} | "
                        + " | ".join(mean_ms(first0[w], first1[w]) for w in _TTFT)
                        + " |"
                    )
                    if stream:
                        cpu_lines.append(
                            f"- c={concurrency}, streamed: "
                            + ", ".join(
                                f"{name} {seconds / n * 1e6:.0f}"
                                for name, seconds in sorted(per_process.items())
                            )
                        )
            lines += ["", "CPU per request of each process (us):", "", *cpu_lines]
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    return lines


def conversation_table(args: argparse.Namespace) -> list[str]:
    return asyncio.run(_conversation(args))


async def _conversation(args: argparse.Namespace) -> list[str]:
    bundle = TokenizerBundle.from_dir(default_tokenizer_dir())
    words = "the yard master signals the freight train onto track seven after the local".split()
    history: list[dict] = [{"role": "system", "content": "You dispatch trains. " * 40}]
    cached_ms, full_ms, render_ms, turns, tokens = [], [], [], 0, 0
    while tokens < args.conversation_tokens:
        turns += 1
        question = " ".join(words[(turns + i) % len(words)] for i in range(120))
        history.append({"role": "user", "content": f"Turn {turns}: {question}?"})
        t = time.perf_counter()
        text = bundle.chat_template.render(history)
        t0 = time.perf_counter()
        render_ms.append((t0 - t) * 1e3)
        ids = await bundle.prompts.encode(text, 10**9, 10**9)
        t1 = time.perf_counter()
        full = bundle.tokenizer.encode(text, add_special_tokens=False).ids
        t2 = time.perf_counter()
        assert ids == full, "the cached path must give the same ids"
        cached_ms.append((t1 - t0) * 1e3)
        full_ms.append((t2 - t1) * 1e3)
        tokens = len(ids)
        answer = " ".join(words[(turns * 3 + i) % len(words)] for i in range(140))
        history.append({"role": "assistant", "content": answer})
    return [
        "## Multi-turn tokenization (one conversation, turn by turn)",
        "",
        f"{turns} turns up to {tokens} prompt tokens; each turn's rendered prompt tokenized "
        "with the preprocessor's cached segments vs one full encode of the same text (the same "
        "ids, checked).",
        "",
        "| | all turns, ms | last turn, ms | per turn mean, ms |",
        "|---|---|---|---|",
        f"| cached segments | {sum(cached_ms):.1f} | {cached_ms[-1]:.2f} | "
        f"{sum(cached_ms) / turns:.2f} |",
        f"| full encode | {sum(full_ms):.1f} | {full_ms[-1]:.2f} | {sum(full_ms) / turns:.2f} |",
        f"| ratio | {sum(full_ms) / sum(cached_ms):.1f}x | {full_ms[-1] / cached_ms[-1]:.1f}x | |",
        f"| (chat template render) | {sum(render_ms):.1f} | {render_ms[-1]:.2f} | "
        f"{sum(render_ms) / turns:.2f} |",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument(
        "--concurrency", default="32", help="comma-separated load points (e.g. 1,32)"
    )
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--conversation-tokens", type=int, default=32_000)
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    parser.add_argument(
        "--no-conversation", action="store_true", help="the stage table only (no part 2)"
    )
    args = parser.parse_args(argv)
    args.concurrencies = [int(c) for c in str(args.concurrency).split(",")]
    if args.quick:
        args.requests, args.conversation_tokens = 40, 3000
    lines = ["# Stages and multi-turn tokenization", ""]
    lines += stage_table(args)
    if not args.no_conversation:
        lines += [""] + conversation_table(args)
    text = "\n".join(lines) + "\n"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "stages.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
