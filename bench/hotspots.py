"""Profile the stack's services under load with py-spy: where does the frontend's CPU go?

Starts the load bench's two SGLang-protocol mock engines and `switchyard up` in front of them,
attaches `py-spy record` to the preprocessor, dispatcher and router while a closed loop of
chat completions runs (streamed; whole replies with --no-stream), and prints, per service,
the functions with the most samples on their own (self) and the most samples anywhere on the
stack (inclusive). Collapsed stacks
and flame graphs go to bench/results/profile/.

    python bench/hotspots.py                          # concurrency 64, 1500 requests
    python bench/hotspots.py --concurrency 128 --requests 3000 --router-mode kv

py-spy comes with the bench extra (`pip install -e .[bench]`); it needs ptrace rights on
the stack's processes (same user; some containers need CAP_SYS_PTRACE).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from harness import pct
from load import MODEL, Processes, served_tokenizer_dir, start_engines, switchyard_stack
from loadgen import HttpTarget, closed_loop, prompts
from procstat import CLOCK_TICKS, CpuMeter, children_map, label, tree, wakeups

HERE = Path(__file__).resolve().parent
SERVICES = ("preprocessor", "dispatcher", "router")


def py_spy() -> str:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        sys.exit("py-spy is not installed: pip install -e .[bench]")
    return exe


def service_pids(root: int) -> dict[str, int]:
    found: dict[str, int] = {}
    for pid in tree(root, children_map()):
        name = label(pid)
        if name in SERVICES and name not in found:
            found[name] = pid
    return found


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name of a process (ZMQ's I/O threads, gRPC's, the main one)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            stat = (task / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


def frame_name(frame: str) -> str:
    """`func (path/to/module.py:12)` -> `func (module.py)`: lines merged per function."""
    func, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    return f"{func} ({path.rsplit('/', 2)[-1] if '/' in path else path})"


Ranking = list[tuple[str, int]]


def summarize(collapsed: Path, top: int) -> tuple[int, Ranking, Ranking]:
    """Total samples, top self frames, top inclusive frames from py-spy's raw output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [frame_name(f) for f in stack.split(";")]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        if frames and frames[0].startswith("thread "):
            frames = frames[1:]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    return total, own.most_common(top), inclusive.most_common(top)


def dispatcher_batching(ready: Path) -> tuple[float, float] | None:
    """(replies, ZMQ messages) the dispatcher sent so far, from its /metrics."""
    import json
    import urllib.request

    try:
        port = json.loads(ready.read_text())["children"]["dispatcher-0"]["metrics_port"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except (OSError, KeyError, ValueError):
        return None
    found = {}
    for line in text.decode().splitlines():
        name, _, value = line.partition(" ")
        if name in (
            "switchyard_dispatcher_replies_total",
            "switchyard_dispatcher_reply_messages_total",
        ):
            found[name] = float(value)
    if len(found) != 2:
        return None
    return found["switchyard_dispatcher_replies_total"], found[
        "switchyard_dispatcher_reply_messages_total"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--no-stream", action="store_true", help="ask for whole replies, not streamed ones"
    )
    parser.add_argument("--prompt-words", type=int, default=48)
    parser.add_argument("--router-mode", default="round_robin")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--up-arg",
        action="append",
        default=[],
        help="extra flag for `switchyard up` (repeat; e.g. --up-arg=--preprocessors=2)",
    )
    parser.add_argument("--idle", action="store_true", help="include idle (waiting) samples")
    parser.add_argument(
        "--native", action="store_true", help="py-spy --native: C/Cython frames too (slower)"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated services to attach py-spy to (default all)"
    )
    parser.add_argument(
        "--no-spy", action="store_true", help="only measure CPU per request (no py-spy attached)"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "profile")
    args = parser.parse_args()
    spy = "" if args.no_spy else py_spy()
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="switchyard-profile-") as tmp:
        (args.out / "logs").mkdir(exist_ok=True)
        procs = Processes(args.out / "logs")
        try:
            tokenizer, _template = served_tokenizer_dir(Path(tmp) / "tokenizer")
            engines, _urls, kv_urls = start_engines(procs, 2, tokenizer, 20.0, 5.0)
            stack = switchyard_stack(procs, "switchyard", kv_urls, args.router_mode, args.up_arg)
            with stack as (base, up):
                pids = service_pids(up.pid)
                target = HttpTarget(
                    "switchyard", base, MODEL, args.max_tokens, stream=not args.no_stream
                )

                async def load(n: int, phase: str) -> float:
                    await target.open()
                    try:
                        items = prompts("profile", phase, n, args.prompt_words, 7)
                        samples, wall = await closed_loop(
                            target, items, args.concurrency, lambda: None
                        )
                        failed = [s.error for s in samples if not s.ok]
                        if failed:
                            sys.exit(f"{len(failed)} of {n} requests failed: {failed[0]}")
                        ttfts.extend(1000 * s.ttft for s in samples)
                        return wall
                    finally:
                        await target.close()

                ttfts: list[float] = []
                asyncio.run(load(min(256, args.requests), "warm"))
                ttfts.clear()
                spies = {}
                only = set(args.only.split(",")) if args.only else set(SERVICES)
                for name, pid in pids.items() if not args.no_spy else ():
                    if name not in only:
                        continue
                    raw = args.out / f"{name}.txt"
                    argv = [spy, "record", "--pid", str(pid), "--rate", str(args.rate)]
                    argv += ["--format", "raw", "--output", str(raw)]
                    if not args.native:  # py-spy cannot read native stacks without pausing
                        argv.append("--nonblocking")
                    if args.idle:
                        argv.append("--idle")
                    if args.native:
                        argv.append("--native")
                    spies[name] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL), raw)
                time.sleep(1.0)  # py-spy attaches
                groups = {"stack": [up.pid]} | {
                    f"engine-{i}": [e.pid] for i, e in enumerate(engines)
                }
                meter = CpuMeter(groups)
                before = meter.snapshot()
                threads_before = {name: thread_cpu(pid) for name, pid in pids.items()}
                wakeups_before = {name: wakeups(pid) for name, pid in pids.items()}
                ready = procs.log_dir / "switchyard.json"
                batching_before = dispatcher_batching(ready)
                wall = asyncio.run(load(args.requests, "run"))
                cpu = meter.diff(before, meter.snapshot())
                batching_after = dispatcher_batching(ready)
                woken = {name: wakeups(pid) - wakeups_before[name] for name, pid in pids.items()}
                threads = {
                    name: {
                        thread: spent - threads_before[name].get(thread, 0.0)
                        for thread, spent in thread_cpu(pid).items()
                    }
                    for name, pid in pids.items()
                }
                for proc, _ in spies.values():
                    proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
                for proc, _ in spies.values():
                    proc.wait(timeout=60)
        finally:
            procs.stop_all()

    print(f"{args.requests} requests at concurrency {args.concurrency} in {wall:.1f} s "
          f"({args.requests / wall:.1f} req/s), router mode {args.router_mode}")  # fmt: skip
    what = "latency" if args.no_stream else "TTFT"
    print(f"{what} ms: p50 {pct(ttfts, 0.5):.1f}, p90 {pct(ttfts, 0.9):.1f}, "
          f"p99 {pct(ttfts, 0.99):.1f}")  # fmt: skip
    per_k = 1000 / args.requests
    stack = {name: sec * per_k for name, sec in sorted(cpu["stack"].items()) if sec > 0}
    print(f"CPU seconds per 1000 requests: stack {sum(stack.values()):.2f} ("
          + ", ".join(f"{name} {sec:.2f}" for name, sec in stack.items())
          + "), engines " + ", ".join(
              f"{sum(cpu[f'engine-{i}'].values()) * per_k:.2f}" for i in range(len(engines))
          ))  # fmt: skip
    if batching_before is not None and batching_after is not None:
        replies = batching_after[0] - batching_before[0]
        messages = batching_after[1] - batching_before[1]
        print(
            f"dispatcher replies per ZMQ message: {replies / max(messages, 1):.2f} "
            f"({replies / args.requests:.1f} replies, {messages / args.requests:.1f} messages "
            "per request)"
        )
    print(
        "wake-ups per request: "
        + ", ".join(f"{name} {count / args.requests:.1f}" for name, count in sorted(woken.items()))
    )
    for name, spent in threads.items():
        print(
            f"  {name} threads: "
            + ", ".join(
                f"{thread} {sec * per_k:.2f}"
                for thread, sec in sorted(spent.items(), key=lambda kv: -kv[1])
                if sec > 0
            )
        )
    for name, (_, raw) in spies.items():
        if not raw.exists():
            print(f"\n## {name}: no profile (py-spy failed?)")
            continue
        total, own, inclusive = summarize(raw, args.top)
        print(f"\n## {name}: {total} samples ({args.out / raw.name})")
        print("self                                                              %")
        for frame, count in own:
            print(f"  {frame[:64]:64s} {100 * count / max(total, 1):5.1f}")
        print("inclusive")
        for frame, count in inclusive:
            print(f"  {frame[:64]:64s} {100 * count / max(total, 1):5.1f}")


if __name__ == "__main__":
    main()
