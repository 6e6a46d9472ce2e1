"""What access logs and tracing cost per request, on vs off in the same run.

One mock engine, fleet, router and dispatcher; one preprocessor per variant, all on that one
backend, each writing its log to a file (a real write per access line):

    off           --no-access-log, tracing off (the baseline)
    access text   the default: one access line per request
    access json   --log-format json
    tracing       --no-access-log --otlp-endpoint (spans exported to an OTLP/gRPC collector
                  in this process, in batches)
    tracing 10%   the same with --trace-sample-ratio 0.1
    json+tracing  both

Rounds: each round runs the same closed-loop load against every variant, in a rotated order
(so a noisy neighbour on a shared machine hits every variant alike). Per variant: the
preprocessor's CPU per request (utime + stime from /proc, over its load runs) and requests/s;
each as the median over rounds, and CPU as a ratio to `off`. Every request streams.

    python bench/operability.py            # the full run
    python bench/operability.py --quick    # tiny, for a smoke test

Results: bench/results/operability.md and .json. Measured on a shared 2-core machine (load
average 11-14, rounds vary by about +-400 us): off 3600 us/request, access text and json within
the noise (-250 / +275), tracing +1400 (1.39x: six spans a request, their export included),
at --trace-sample-ratio 0.1 about half of that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

# The collector's gRPC server runs in this process, which then starts the services: with fork
# support on (read when grpc is imported), gRPC logs at every start that it skips its handlers.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import grpc  # noqa: E402
from harness import wait_ready  # noqa: E402
from load import MODEL, Processes  # noqa: E402
from loadgen import closed_run  # noqa: E402
from opentelemetry.proto.collector.trace.v1 import (  # noqa: E402
    trace_service_pb2,
    trace_service_pb2_grpc,
)
from procstat import read_stat  # noqa: E402

from switchyard.common.ports import read_ready_file  # noqa: E402

HERE = Path(__file__).resolve().parent
LOCAL = "tcp://127.0.0.1:0"
VARIANTS: dict[str, list[str]] = {
    "off": ["--no-access-log"],
    "access text": [],
    "access json": ["--log-format", "json"],
    "tracing": ["--no-access-log", "--otlp-endpoint", "{otlp}"],
    "tracing 10%": ["--no-access-log", "--otlp-endpoint", "{otlp}", "--trace-sample-ratio", "0.1"],
    "json+tracing": ["--log-format", "json", "--otlp-endpoint", "{otlp}"],
}


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP collector that counts the spans it is sent (and drops them)."""

    def __init__(self) -> None:
        self.spans = 0
        self._lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 - the gRPC method name
        n = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self._lock:
            self.spans += n
        return trace_service_pb2.ExportTraceServiceResponse()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400, help="per variant and round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--quick", action="store_true", help="tiny: 1 round of 16 requests")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.requests, args.concurrency, args.tokens = 1, 16, 4, 4
    return args


def start(procs: Processes, name: str, *argv: str) -> tuple[str, Any, Path]:
    ready = procs.log_dir / f"{name}.json"
    ready.unlink(missing_ok=True)
    return name, procs.start_switchyard(name, *argv, "--ready-file", str(ready)), ready


def report(procs: Processes, started: tuple[str, Any, Path]) -> dict[str, Any]:
    name, proc, ready = started
    try:
        got: dict[str, Any] = read_ready_file(ready, proc, 90.0)
    except RuntimeError as exc:
        raise RuntimeError(f"{name}: {exc}: {procs.log_tail(proc)}") from exc
    got["proc"] = proc
    return got


def serve(procs: Processes, name: str, *argv: str) -> dict[str, Any]:
    return report(procs, start(procs, name, *argv))


async def load(base: str, args: argparse.Namespace, tag: str) -> float:
    """One closed-loop run; its wall time (raises on any failed request)."""
    _, wall = await closed_run(
        base, MODEL, args.tokens, tag, args.requests, args.concurrency, words=24, code="OP"
    )
    return wall


def cpu(pid: int) -> float:
    stat = read_stat(pid)
    if stat is None:
        raise RuntimeError(f"process {pid} is gone")
    return stat[1]


def run(args: argparse.Namespace) -> dict[str, Any]:
    sink = Sink()
    collector = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, collector)
    otlp = f"http://127.0.0.1:{collector.add_insecure_port('127.0.0.1:0')}"
    collector.start()
    tmp = Path(tempfile.mkdtemp(prefix="switchyard-operability-"))
    procs = Processes(tmp)
    quiet = ["--log-level", "WARNING"]
    try:
        engine = serve(
            procs, "engine", "mock-engine", "--protocol", "sglang", "--port", "0",
            "--model-name", MODEL, "--ttft-ms", "2", "--itl-ms", "1", *quiet,
        )  # fmt: skip
        fleet = serve(
            procs, "fleet", "fleet", "--control", LOCAL, "--events", LOCAL,
            "--worker", f"grpc://127.0.0.1:{engine['port']}", "--metrics-port", "off", *quiet,
        )  # fmt: skip
        fleet_flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
        router = serve(procs, "router", "router", "--bind", LOCAL, *fleet_flags, *quiet)
        dispatcher = serve(procs, "dispatcher", "dispatcher", "--bind", LOCAL, *fleet_flags, *quiet)
        starting = {
            name: start(
                procs, f"preprocessor-{name.replace(' ', '-')}", "preprocessor", "--port", "0",
                "--router", router["bind"], "--dispatcher", dispatcher["bind"], *fleet_flags,
                *[f.format(otlp=otlp) for f in flags],
            )
            for name, flags in VARIANTS.items()
        }  # fmt: skip
        bases: dict[str, str] = {}
        pids: dict[str, int] = {}
        for name, one in starting.items():
            pre = report(procs, one)
            bases[name] = f"http://127.0.0.1:{pre['port']}"
            pids[name] = pre["proc"].pid
            wait_ready(bases[name], pre["proc"], timeout=90)
        for base in bases.values():  # warm-up: connections, tokenizer caches
            asyncio.run(load(base, argparse.Namespace(**{**vars(args), "requests": 16}), "w"))
        names = list(VARIANTS)
        per_round: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                before = cpu(pids[name])
                wall = asyncio.run(load(bases[name], args, f"r{r}"))
                spent = cpu(pids[name]) - before
                per_round[name].append((spent / args.requests, args.requests / wall))
    finally:
        procs.stop_all()  # a stopping preprocessor exports the spans it still holds
        collector.stop(grace=None)
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "config": {k: v for k, v in vars(args).items() if k != "out_dir"},
        "spans_exported": sink.spans,
        "variants": {
            name: {
                "cpu_us_per_request": [c * 1e6 for c, _ in rounds],
                "req_s": [q for _, q in rounds],
            }
            for name, rounds in per_round.items()
        },
    }


def table(result: dict[str, Any]) -> list[str]:
    config = result["config"]
    base = statistics.median(result["variants"]["off"]["cpu_us_per_request"])
    lines = [
        "# Access log and tracing: cost per request",
        "",
        f"{config['rounds']} rounds x {config['requests']} streamed requests per variant, closed "
        f"loop at concurrency {config['concurrency']}, {config['tokens']} output tokens; one "
        "mock engine (TTFT 2 ms, ITL 1 ms). Preprocessor CPU per request (utime + stime) and "
        "requests/s: medians over rounds; CPU ratio to `off` (no access log, no tracing). "
        f"Spans exported to the collector: {result['spans_exported']}.",
        "",
        "| variant | preprocessor CPU us/request | ratio | extra us/request | req/s |",
        "|---|---|---|---|---|",
    ]
    for name, v in result["variants"].items():
        us = statistics.median(v["cpu_us_per_request"])
        rate = statistics.median(v["req_s"])
        lines.append(f"| {name} | {us:.0f} | {us / base:.3f} | {us - base:+.0f} | {rate:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    lines = table(result)
    (args.out_dir / "operability.md").write_text("\n".join(lines) + "\n")
    (args.out_dir / "operability.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
