"""The whole stack, one transport against the other: tcp:// or ipc:// between its processes.

Two SGLang-protocol mock engines and one fleet are shared; each run starts its own router,
dispatcher and preprocessor, wired over the variant's transport, and a client child that runs
a closed loop of streamed chat completions against it (bench/loadgen.py's HttpTarget). The
client reads the CPU time and voluntary context switches of the three processes from /proc
over the measured window; TTFT and throughput come from its own samples.

Variants:
  tcp      the router and dispatcher endpoints on tcp://127.0.0.1 (what `switchyard up` uses)
  ipc      the same on ipc:// sockets in a temporary folder
  tcp-ref  tcp, its dispatcher run by --ref-python (another checkout's): a before/after of the
           dispatcher in one run, e.g. `hops.py stack --variants tcp-ref,tcp --ref-python P`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SERVICES = ("router", "dispatcher", "preprocessor")
MODEL = "deepseek-mock"


# --- the client child ----------------------------------------------------------------------


def _target(base: str, tokens: int) -> Any:
    """loadgen's HttpTarget, its idle connections dropped after 2 s: with httpx's default of
    5 s, the same as uvicorn's keep-alive timeout, a request now and then went out on a
    connection the server was closing and failed (ReadError), more often the busier the
    machine."""
    import httpx
    from loadgen import HttpTarget

    class Target(HttpTarget):
        async def open(self) -> None:
            limits = httpx.Limits(
                max_connections=None, max_keepalive_connections=None, keepalive_expiry=2.0
            )
            timeout = httpx.Timeout(120.0, connect=10.0)
            self.clients = [
                httpx.AsyncClient(base_url=self.base, timeout=timeout, limits=limits)
                for _ in range(self.lanes)
            ]

    return Target("stack", base, MODEL, tokens)


async def _drive(args: argparse.Namespace) -> dict[str, Any]:
    from hops import wait_go
    from hops_route import proc_usage
    from loadgen import prompts

    pids = dict(zip(SERVICES, (int(p) for p in args.pids.split(",")), strict=True))
    target = _target(args.base, args.tokens)
    await target.open()
    items = prompts(args.tag, "run", 4096, 40, 7)
    counter = iter(range(1 << 62))
    samples: list[Any] = []

    async def worker(deadline: float, count: int) -> None:
        done = 0
        for i in counter:
            if (deadline and time.perf_counter() > deadline) or (count and done >= count):
                return
            samples.append(await target.send(i, items[i % len(items)]))
            done += 1

    await asyncio.gather(*(worker(0.0, 3) for _ in range(args.concurrency)))
    bad = [s for s in samples if not s.ok]
    if bad:
        raise RuntimeError(f"warm-up failed: {bad[0].error}")
    samples.clear()
    # Fresh connections for the run: the wait for the other stack can outlast the server's
    # keep-alive timeout, and a request on a connection the server is closing fails.
    await target.close()
    await wait_go()
    await target.open()
    before = {name: proc_usage(pid) for name, pid in pids.items()}
    start = time.perf_counter()
    deadline = start + args.seconds
    await asyncio.gather(*(worker(deadline, 0) for _ in range(args.concurrency)))
    wall = time.perf_counter() - start
    after = {name: proc_usage(pid) for name, pid in pids.items()}
    await target.close()
    good = [s for s in samples if s.ok]
    if len(good) != len(samples):
        first = next(s.error for s in samples if not s.ok)
        raise RuntimeError(f"{len(samples) - len(good)} requests failed, the first: {first}")
    return {
        "requests": len(good),
        "tokens": sum(s.tokens for s in good),
        "wall_s": wall,
        "cpu_s": {n: after[n][0] - before[n][0] for n in SERVICES},
        "wakeups": {n: after[n][1] - before[n][1] for n in SERVICES},
        "ttft_p50": statistics.median(s.ttft for s in good),
        "e2e_p50": statistics.median(s.e2e for s in good),
    }


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--pids", required=True, help="router,dispatcher,preprocessor")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args(argv)
    import uvloop

    print(json.dumps(uvloop.run(_drive(args))))


# --- the parent ----------------------------------------------------------------------------

VARIANTS = ("tcp", "ipc", "tcp-ref")
DEFAULT_VARIANTS = ("tcp", "ipc")  # tcp-ref on request (it needs --ref-python)


class _Run:
    """A router, a dispatcher and a preprocessor on the variant's transport, and a client."""

    def __init__(self, variant: str, ctx: dict[str, Any], concurrency: int, seconds: float):
        from harness import wait_ready
        from hops import ChildJob

        from switchyard.common.ports import free_port

        procs = ctx["procs"]
        self.procs = procs
        self.variant = variant
        tag = f"{variant}-{time.monotonic_ns()}"
        if variant.startswith("tcp"):
            router, dispatcher = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
        else:
            router, dispatcher = (f"ipc://{ctx['tmp']}/{n}-{tag}.sock" for n in SERVICES[:2])
        fleet = ["--fleet-control", ctx["control"], "--fleet-events", ctx["events"]]
        quiet = ["--log-level", "WARNING"]
        http = free_port()
        self.started = [
            procs.start_switchyard(f"router-{tag}", "router", "--bind", router, *fleet, *quiet),
            procs.start_switchyard(
                f"dispatcher-{tag}", "dispatcher", "--bind", dispatcher, *fleet, *quiet,
                python=ctx["ref_python"] if variant.endswith("-ref") else None,
            ),
            procs.start_switchyard(
                f"preprocessor-{tag}", "preprocessor", "--port", str(http), "--router", router,
                "--dispatcher", dispatcher, "--tokenizer", ctx["tokenizer"], *fleet, *quiet,
            ),
        ]  # fmt: skip
        base = f"http://127.0.0.1:{http}"
        try:
            wait_ready(base, self.started[2], timeout=120)
        except RuntimeError as exc:
            self._stop()
            raise RuntimeError(f"{exc}: {procs.log_tail(self.started[2])}") from exc
        argv = ["hops_stack.py", "--base", base, "--tag", tag]
        argv += ["--pids", ",".join(str(p.pid) for p in self.started)]
        argv += ["--concurrency", str(concurrency), "--seconds", str(seconds)]
        argv += ["--tokens", str(ctx["tokens"])]
        self.client = ChildJob(argv)
        self.warmed = self.client.warmed
        self.go = self.client.go

    def _stop(self) -> None:
        for proc in self.started:
            self.procs.stop(proc)

    def result(self) -> dict[str, float]:
        try:
            r = self.client.output()
        except RuntimeError as exc:
            tails = " | ".join(f"{p.args[3]}: {self.procs.log_tail(p, 12)}" for p in self.started)
            raise RuntimeError(f"{self.variant}: {exc} | {tails}") from exc
        finally:
            self._stop()
        n = r["requests"]
        cpu, woken = r["cpu_s"], r["wakeups"]
        out = {"cpu_ms_per_req": sum(cpu.values()) / n * 1e3}
        out.update({f"{s}_ms": cpu[s] / n * 1e3 for s in SERVICES})
        out["wakeups_per_req"] = sum(woken.values()) / n
        out.update(
            ttft_p50_ms=r["ttft_p50"] * 1e3, e2e_p50_ms=r["e2e_p50"] * 1e3, req_s=n / r["wall_s"]
        )
        return out


def run(args: argparse.Namespace, progress: Callable[[str], None]) -> tuple[list[Any], list[str]]:
    from hops import Comparison, run_pairs
    from load import Processes, _engine_up, served_tokenizer_dir

    from switchyard.common.ports import free_port

    quick = args.quick
    variants = (args.variants or ",".join(DEFAULT_VARIANTS)).split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown stack variants: {unknown}; known: {list(VARIANTS)}")
    if "tcp-ref" in variants and not getattr(args, "ref_python", None):
        raise SystemExit("the tcp-ref variant needs --ref-python")
    concurrencies = [int(c) for c in (args.concurrency or ("4" if quick else "1,32")).split(",")]
    tokens = int((args.tokens or "16").split(",")[0])
    rounds = args.rounds or (1 if quick else 3)
    seconds = args.seconds or (1.0 if quick else 8.0)
    comparisons = []
    with tempfile.TemporaryDirectory(prefix="hops-stack-") as tmp:
        procs = Processes(Path(tmp))
        try:
            tokenizer, _ = served_tokenizer_dir(Path(tmp) / "tokenizer")
            urls = []
            for index in range(2):
                port = free_port()
                argv = ["mock-engine", "--protocol", "sglang", "--port", str(port)]
                argv += ["--model-name", MODEL, "--tokenizer", str(tokenizer)]
                argv += ["--ttft-ms", "5", "--itl-ms", "2", "--log-level", "WARNING"]
                procs.start_switchyard(f"engine-{index}", *argv)
                urls.append(f"grpc://127.0.0.1:{port}")
            for url in urls:
                asyncio.run(_engine_up(url, 90.0))
            control, events = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
            fleet = ["fleet", "--control", control, "--events", events, "--log-level", "WARNING"]
            for url in urls:
                fleet += ["--worker", url]
            procs.start_switchyard("fleet", *fleet)
            ctx = {
                "procs": procs,
                "tmp": tmp,
                "control": control,
                "events": events,
                "tokenizer": str(tokenizer),
                "tokens": tokens,
                "ref_python": getattr(args, "ref_python", None),
            }
            for concurrency in concurrencies:
                comparison = Comparison(
                    "stack",
                    f"c={concurrency} tokens={tokens}",
                    variants[0],
                    ["cpu_ms_per_req", *(f"{s}_ms" for s in SERVICES), "wakeups_per_req",
                     "ttft_p50_ms", "e2e_p50_ms", "req_s"],
                )  # fmt: skip

                def launch(variant: str, c: int = concurrency) -> _Run:
                    return _Run(variant, ctx, c, seconds)

                comparisons.append(run_pairs(comparison, variants, rounds, launch, progress))
        finally:
            procs.stop_all()
    notes = [
        "Per streamed chat completion: CPU and voluntary context switches of the router, "
        "dispatcher and preprocessor (from /proc, 10 ms ticks), two SGLang-protocol mock "
        "engines (TTFT 5 ms, ITL 2 ms) and one fleet shared by both stacks.",
        "",
    ]
    return comparisons, notes


if __name__ == "__main__":
    child_main(sys.argv[1:])
