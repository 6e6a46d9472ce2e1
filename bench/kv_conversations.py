"""KV routing on real fleets of mock engines: multi-turn conversations and bursts of a new
shared prefix, KV-aware routing vs round-robin vs the previous router, in one run.

Engines: 4 mock engines per fleet (SGLang-only, vLLM-only, mixed) with a realistic prefill
cost: --prefill-ms-per-token (default 0.4: 2.5k tokens/s, a large model) and
--prefill-stalls-decode, so an engine prefills one request at a time and a queue of prefills
costs waiting time (as on a GPU). The simulated times are long enough that the frontend's
own CPU time (noisy on a shared machine) does not dominate the TTFTs.

1. Conversations: C conversations of T turns; each turn's prompt is the previous prompt, the
   answer the engine gave and a new question; a closed loop keeps `--concurrency` turns in
   flight (a conversation's next turn waits for its answer). Reported per fleet and mode:
   the engine-reported prefix hit rate (sum of cached_tokens / sum of prompt_tokens), as a
   share of the same workload on ONE engine of the same size at the same concurrency (the
   issue's target: >= 95%) and as a share of the best possible (below), and TTFT mean / p90.
2. Bursts: G groups; each group is K requests sharing a new 2k-token prefix, sent at once.
   Reported: hit rate, share of the best possible, and the requests per group that found no
   cached prefix (1 is the minimum: the group's first prefill).

The best possible hit rate (`bound`), for both: the same requests served one at a time by a
single engine whose cache never evicts, so every block an earlier request stored is reused
(whole blocks, never the last prompt token, as the engines reuse them). It is measured in the
same run, not computed.

Modes: `kv` (this router's default), `round_robin`, `kv booking off` (bursts: --booking-ttl 0,
item 8 off), `previous kv` (the previous router's kv policy: the stack of another checkout,
given with --baseline-python, e.g. /work/main/.venv/bin/python), and `smg` (the smg gateway,
`--smg-spec`, default smg==1.13.0, installed into bench/.smg-venv on first use as
bench/load.py does, with `--policy cache_aware`: its KV index fed by the engines' events; on
the single-protocol fleets). Every mode runs in front of fresh mock engines of this checkout
(started apart, given to the gateway as URLs), so every gateway meets the same engine
behaviour from the same empty caches.

`--repeats N` runs every row group N times, the modes interleaved within each repeat (the
order rotates), and reports each mode's median hit rate and TTFT over the repeats with the
load average at the start and end: the machine is shared, so TTFT means are noisy; the hit
rate is the robust number.

    python bench/kv_conversations.py [--baseline-python PY] [--fleets sglang,vllm,mixed]
    python bench/kv_conversations.py --no-conversations     # the bursts alone
    python bench/kv_conversations.py --fleets sglang --modes kv,smg,round_robin \
        --concurrency 8 --concurrency 32 --repeats 3      # the head-to-head with smg
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
from harness import pct, stop, wait_ready

from switchyard.common.ports import free_port, read_ready_file
from switchyard.common.workers import worker_flag

MODEL = "deepseek-mock"
FLEETS = {"sglang": "sglang,sglang,sglang,sglang", "vllm": "vllm,vllm,vllm,vllm",
          "mixed": "sglang,vllm,sglang,vllm"}  # fmt: skip


@dataclass
class Result:
    ttft: float
    prompt_tokens: int
    cached_tokens: int


def _has_ready_file(python: str) -> bool:
    """Whether that checkout's `up` binds port 0 and reports it (`--ready-file`)."""
    import subprocess

    done = subprocess.run(
        [python, "-m", "switchyard", "up", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),  # not this checkout: `-m` imports from the working directory
    )
    return "--ready-file" in done.stdout


@contextlib.contextmanager
def mock_engines(engines: str, mock_args: list[str], folder: Path) -> Iterator[list[str]]:
    """This checkout's mock engines, one per protocol in `engines`, as `--worker` URLs with
    their KV-event endpoints: every mode (the previous checkout's router too) is measured
    against the same engines."""
    import subprocess

    local = "tcp://127.0.0.1:0"
    procs, reports = [], []
    try:
        for n, protocol in enumerate(engines.split(",")):
            ready = folder / f"engine-{n}.json"
            argv = [sys.executable, "-m", "switchyard", "mock-engine", "--protocol", protocol]
            argv += ["--port", "0", "--ready-file", str(ready), "--model-name", MODEL]
            argv += ["--kv-events-endpoint", local, "--kv-replay-endpoint", local]
            argv += ["--log-level", "WARNING", *mock_args]
            procs.append(subprocess.Popen(argv, start_new_session=True))
            reports.append(ready)
        workers = []
        for proc, ready in zip(procs, reports, strict=True):
            r = read_ready_file(ready, proc, 120)
            url = f"grpc://127.0.0.1:{r['port']}"
            workers.append(worker_flag(url, kv_events=r["kv_events"], kv_replay=r["kv_replay"]))
        yield workers
    finally:
        stop(*procs)


SMG = "smg"


@contextlib.contextmanager
def smg_stack(engines: str, mock_args: list[str], spec: str, policy: str) -> Iterator[str]:
    """smg (`smg launch --policy POLICY`) in front of fresh mock engines of one protocol."""
    from load import SMG_VENV, Processes, Progress, ensure_smg, served_tokenizer_dir, smg_gateway

    protocols = set(engines.split(","))
    if protocols != {"sglang"}:  # bench/load.py launches smg with --backend sglang
        raise ValueError(f"smg runs on the sglang fleet here, not {engines}")
    exe = ensure_smg(SMG_VENV, spec, Progress(0))
    with tempfile.TemporaryDirectory(prefix="kv-conversations-smg-") as folder:
        tokenizer, template = served_tokenizer_dir(Path(folder) / "tokenizer")
        with mock_engines(engines, [*mock_args, f"--tokenizer={tokenizer}"], Path(folder)) as ws:
            procs = Processes(Path(folder))
            try:
                urls = [w.partition("?")[0] for w in ws]
                with smg_gateway(procs, exe, urls, tokenizer, template, policy) as (base, _):
                    yield base
            finally:
                procs.stop_all()


@contextlib.contextmanager
def gateway(
    mode: tuple[str, str, list[str]], engines: str, mock: list[str], spec: str
) -> Iterator[str]:
    name, python, up = mode
    if name == SMG:
        with smg_stack(engines, mock, spec, "cache_aware") as base:
            yield base
    else:
        with stack(python, engines, mock, up) as base:
            yield base


def load_average() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


@contextlib.contextmanager
def stack(python: str, engines: str, mock_args: list[str], up_args: list[str]) -> Iterator[str]:
    """`switchyard up` of the checkout `python` belongs to, in front of this checkout's mock
    engines, on a port it binds itself (port 0, read from its ready file)."""
    import subprocess

    with (
        tempfile.TemporaryDirectory(prefix="kv-conversations-") as folder,
        mock_engines(engines, mock_args, Path(folder)) as workers,
    ):
        argv = [python, "-m", "switchyard", "up", "--log-level", "WARNING", *up_args]
        for worker in workers:
            argv += ["--worker", worker]
        ready = Path(folder) / "up.json"
        if python == sys.executable or _has_ready_file(python):
            argv += ["--http-port", "0", "--ready-file", str(ready)]
            port = None
        else:  # a checkout from before ready files: it can only be given a port
            port = free_port()
            argv += ["--http-port", str(port)]
        # cwd: an empty folder, so `-m switchyard` imports the package of `python`'s own
        # checkout, not the one this script was started in.
        proc = subprocess.Popen(argv, start_new_session=True, cwd=folder)
        try:
            if port is None:
                base = read_ready_file(ready, proc, 180)["base_url"]
            else:
                base = f"http://127.0.0.1:{port}"
            wait_ready(base, proc, timeout=180)
            yield base
        finally:
            stop(proc)


async def ask(http: httpx.AsyncClient, messages: list[dict], max_tokens: int) -> tuple[Result, str]:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    start = time.perf_counter()
    ttft = None
    usage = None
    text: list[str] = []
    async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                if ttft is None:
                    ttft = time.perf_counter() - start
                text.append(chunk["choices"][0]["delta"]["content"])
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert ttft is not None and usage is not None
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return Result(ttft, usage["prompt_tokens"], cached), "".join(text)


def conversation_openings(count: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    out = []
    for c in range(count):
        system = f"You are dispatcher {c} of yard {rng.randrange(10**6)}. " + " ".join(
            f"Track {i} holds {rng.randrange(99)} wagons of ore." for i in range(30)
        )
        out.append([{"role": "system", "content": system}])
    return out


def question(conversation: int, turn: int) -> str:
    return f"Turn {turn}: where does wagon {conversation * 1000 + turn * 37} go next, and why?"


async def conversations(
    base: str, count: int, turns: int, concurrency: int, answer_tokens: int, seed: int
) -> list[Result]:
    histories = conversation_openings(count, seed)
    next_turn = [0] * count
    busy = [False] * count
    results: list[Result] = []
    lock = asyncio.Lock()

    async def client(http: httpx.AsyncClient) -> None:
        while True:
            async with lock:
                pick = next((c for c in range(count) if not busy[c] and next_turn[c] < turns), None)
                if pick is None:
                    if all(t >= turns for t in next_turn):
                        return
                else:
                    busy[pick] = True
            if pick is None:
                await asyncio.sleep(0.005)
                continue
            messages = histories[pick] + [
                {"role": "user", "content": question(pick, next_turn[pick])}
            ]
            result, answer = await ask(http, messages, answer_tokens)
            results.append(result)
            histories[pick] = messages + [{"role": "assistant", "content": answer}]
            next_turn[pick] += 1
            busy[pick] = False

    async with httpx.AsyncClient(
        base_url=base, timeout=300, limits=httpx.Limits(max_connections=256)
    ) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return results


async def bursts(
    base: str, groups: int, size: int, seed: int, sequential: bool = False
) -> list[list[Result]]:
    rng = random.Random(seed)
    out = []
    async with httpx.AsyncClient(
        base_url=base, timeout=300, limits=httpx.Limits(max_connections=256)
    ) as http:
        for g in range(groups):
            prefix = f"Manual {g}-{rng.randrange(10**6)}. " + " ".join(
                f"Clause {i}: wagons of class {rng.randrange(99)} need {rng.randrange(9)} checks."
                for i in range(150)
            )
            asks = [
                ask(
                    http,
                    [
                        {"role": "system", "content": prefix},
                        {"role": "user", "content": f"Question {k}: which clause covers {k}?"},
                    ],
                    4,
                )
                for k in range(size)
            ]
            if sequential:  # the bound: one at a time, each after the previous is cached
                out.append([(await a)[0] for a in asks])
            else:
                out.append([r for r, _ in await asyncio.gather(*asks)])
            await asyncio.sleep(1.0)  # the next group starts on an idle fleet
    return out


def hit(results: list[Result]) -> float:
    return sum(r.cached_tokens for r in results) / max(1, sum(r.prompt_tokens for r in results))


def ttfts(results: list[Result]) -> tuple[float, float]:
    ms = [r.ttft * 1e3 for r in results]
    return statistics.mean(ms), pct(ms, 0.9)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fleets", default="sglang,vllm,mixed")
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--concurrency", type=int, action="append", default=None)
    parser.add_argument("--answer-tokens", type=int, default=24)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.4)
    parser.add_argument("--baseline-python", default=None, help="the previous checkout's python")
    parser.add_argument("--no-bursts", action="store_true")
    parser.add_argument("--no-conversations", action="store_true", help="the bursts alone")
    parser.add_argument(
        "--modes",
        default="kv,round_robin",
        help="comma-separated: kv, round_robin (and the "
        "previous router's kv with --baseline-python)",
    )
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the one-engine and best-possible runs (shares print as n/a)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="runs per row group (medians)")
    parser.add_argument("--smg-spec", default="smg==1.13.0", help="pip requirement for smg")
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        help="extra flag for this checkout's router in the kv mode (repeat), e.g. "
        "--router-arg=--work-weight=0.3",
    )
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "kv_conversations.md")
    )
    args = parser.parse_args()
    loads = args.concurrency or [1, 8]
    mock = [
        f"--prefill-ms-per-token={args.prefill_ms_per_token}",
        "--prefill-base-ms=10",
        "--prefill-stalls-decode",
        "--ttft-ms=20",
        "--itl-ms=15",
    ]
    unbounded = [*mock, "--num-blocks=1000000"]
    me = sys.executable
    wanted = args.modes.split(",")
    tuned = [f"--router-arg={a}" for a in args.router_arg]
    modes: list[tuple[str, str, list[str]]] = [
        (m, me, ["--router-mode", m, *(tuned if m == "kv" else [])])
        for m in ("kv", "round_robin")
        if m in wanted
    ]
    if SMG in wanted:
        modes.append((SMG, "", []))
    if args.baseline_python:
        modes.append(("previous kv", args.baseline_python, ["--router-mode", "kv"]))
    lines = [
        f"Mock engines: prefill {args.prefill_ms_per_token} ms/token, one prefill at a time "
        f"per engine; {args.conversations} conversations x {args.turns} turns "
        f"(answers of {args.answer_tokens} tokens); seed {args.seed}. "
        + (
            f"Medians of {args.repeats} runs, modes interleaved; "
            if args.repeats > 1
            else "One run; "
        )
        + "the machine was shared with other jobs, so TTFTs are noisy: compare within a row "
        f"group. Load average at start: {load_average()}."
        + (f" kv router flags: {' '.join(args.router_arg)}." if args.router_arg else ""),
        "",
        "## Multi-turn conversations",
        "",
        "| fleet | in flight | mode | hit rate | / one engine | / best possible | TTFT mean ms "
        "| TTFT p90 ms | mean / round-robin |"
        + (" runs (hit, TTFT mean ms) |" if args.repeats > 1 else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if args.repeats > 1 else ""),
    ]

    def run(base: str, load: int):  # noqa: ANN202 - a coroutine of list[Result]
        return conversations(
            base, args.conversations, args.turns, load, args.answer_tokens, args.seed
        )

    for fleet in [] if args.no_conversations else args.fleets.split(","):
        engines = FLEETS[fleet]
        single = engines.split(",")[0]
        best = one = float("nan")
        if not args.no_reference:
            with stack(me, single, unbounded, ["--router-mode", "kv"]) as base:
                best = hit(asyncio.run(run(base, 1)))
        for load in loads:
            if not args.no_reference:
                with stack(me, single, mock, ["--router-mode", "kv"]) as base:
                    one = hit(asyncio.run(run(base, load)))
            runs: dict[str, list[tuple[float, float, float]]] = {}
            fleet_modes = [m for m in modes if m[0] != SMG or fleet == "sglang"]
            for repeat in range(args.repeats):
                turn = repeat % len(fleet_modes)
                for mode in fleet_modes[turn:] + fleet_modes[:turn]:  # interleaved, rotating
                    with gateway(mode, engines, mock, args.smg_spec) as base:
                        results = asyncio.run(run(base, load))
                    runs.setdefault(mode[0], []).append((hit(results), *ttfts(results)))
                    print(
                        f"{fleet} c{load} {mode[0]} run {repeat + 1}: hit {hit(results):.1%} "
                        f"ttft {ttfts(results)[0]:.0f} ms (load {load_average()})",
                        file=sys.stderr,
                    )
            rows = {
                name: tuple(statistics.median(r[i] for r in got) for i in range(3))
                for name, got in runs.items()
            }
            rr_mean = rows["round_robin"][1] if "round_robin" in rows else float("nan")
            for name, (rate, mean, p90) in rows.items():
                spread = ""
                if args.repeats > 1:
                    each = runs[name]
                    spread = " " + "; ".join(f"{r[0]:.1%}, {r[1]:.0f}" for r in each) + " |"
                lines.append(
                    f"| {fleet} | {load} | {name} | {rate:.1%} | {rate / one:.0%} | "
                    f"{rate / best:.0%} | {mean:.0f} | {p90:.0f} | {mean / rr_mean:.2f} |" + spread
                )
            if not args.no_reference:
                lines.append(
                    f"| {fleet} | {load} | one engine | {one:.1%} | 100% | {one / best:.0%} | | | |"
                )
        if not args.no_reference:
            lines.append(f"| {fleet} | 1 | best possible | {best:.1%} | | 100% | | | |")
    if not args.no_bursts:
        lines += [
            "",
            f"## Bursts: {args.groups} groups of {args.burst} requests sharing a new ~2k-token "
            "prefix, sent at once",
            "",
            "| fleet | mode | hit rate | / best possible | cold requests per group | "
            "TTFT mean ms | TTFT p90 ms |",
            "|---|---|---|---|---|---|---|",
        ]
        burst_modes = [
            modes[0],
            ("kv booking off", me, ["--router-mode", "kv", "--router-arg=--booking-ttl=0"]),
            *modes[1:],
        ]
        for fleet in args.fleets.split(","):
            with stack(me, FLEETS[fleet].split(",")[0], unbounded, ["--router-mode", "kv"]) as b:
                best_groups = asyncio.run(bursts(b, args.groups, args.burst, args.seed, True))
            bound = hit([r for g in best_groups for r in g])
            prefix = [max(r.cached_tokens for r in g) for g in best_groups]
            for mode in burst_modes:
                name = mode[0]
                if name == SMG and fleet != "sglang":
                    continue
                with gateway(mode, FLEETS[fleet], mock, args.smg_spec) as base:
                    groups = asyncio.run(bursts(base, args.groups, args.burst, args.seed))
                flat = [r for g in groups for r in g]
                cold = statistics.mean(
                    sum(1 for r in g if r.cached_tokens < 0.5 * p)
                    for g, p in zip(groups, prefix, strict=True)
                )
                mean, p90 = ttfts(flat)
                share = f"{hit(flat) / bound:.0%}" if bound else "n/a"
                lines.append(
                    f"| {fleet} | {name} | {hit(flat):.1%} | {share} | {cold:.1f} | "
                    f"{mean:.0f} | {p90:.0f} |"
                )
                print(f"burst {fleet} {name}: done", file=sys.stderr)
    lines.append("")
    lines.append(f"Load average at the end: {load_average()}.")
    table = "\n".join(lines)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
