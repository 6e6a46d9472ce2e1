"""The dispatcher's gRPC hop: client-side CPU of unary-stream Generate calls, per variant.

Each variant is a way for an asyncio process to run many concurrent Generate streams against
one engine (the SGLang-protocol mock engine with zero delays). Every measurement runs in a
fresh child process (its own gRPC state, its own env such as GRPC_POLL_STRATEGY); the child
warms up, then runs a closed loop of `requests` streams at a fixed concurrency and reports its
own CPU time (getrusage: every thread of the process, robust to other load on the machine)
and the wall-clock latency of each stream.

Variants (see VARIANTS; the default set is DEFAULT_VARIANTS):
  aio              today's path: EngineClient.generate over a grpc.aio channel
  aio-read         the same channel, `await call.read()` instead of `async for`
  aio-x4           four channels per engine (own subchannels), streams spread over them
  poll             aio with GRPC_POLL_STRATEGY=poll
  http2            EngineClient.generate over the loop's own HTTP/2 connection
                   (engines/http2.py: the dispatcher's default since it was measured here)
  aio-noee         aio with GRPC_EXPERIMENTS=-event_engine_client (the client channel on
                   gRPC's iomgr poller instead of the EventEngine's thread pool)
  aio-nochannelz, aio-nobdp, aio-minimal, aio-noreuseport, aio-nocompress
                   aio with one more channel option: grpc.enable_channelz 0,
                   grpc.http2.bdp_probe 0, grpc.minimal_stack 1, grpc.so_reuseport 0,
                   grpc.default_compression_algorithm 0
  sync-st          the sync stub with ChannelOptions.SingleThreadedUnaryStream, each stream
                   read by a thread of a pool, messages handed to the loop (call_soon_threadsafe)
  sync-mt          the same with the default (multi-threaded) sync channel
  aio-ref          `aio` run by --ref-python: another checkout's EngineClient (before/after)

Besides CPU per message and per request, each run reports its voluntary context switches per
message (wake-ups) and, in its JSON line, CPU and wake-ups per thread name (event_engine: gRPC
core's threads; python: the loop's thread, gRPC's poller, the readers of sync-*).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import json
import os
import resource
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.experimental
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from switchyard.common.engines.base import CHANNEL_OPTIONS
from switchyard.common.engines.connect import client_for, open_streams
from switchyard.common.engines.sglang import SglangClient
from switchyard.common.instance_id import grpc_target
from switchyard.protos.messages import GenerateRequest, SamplingParams

Opener = Callable[[str], "StreamClient"]


class StreamClient:
    """What a variant gives the driver: generate(request) yields the engine's replies."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[Any]:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class AioEngine(StreamClient):
    """The library's EngineClient (today's dispatcher path), optionally over several channels."""

    def __init__(
        self,
        url: str,
        channels: int = 1,
        extra: list[tuple[str, Any]] = (),
        http2: bool = False,
    ) -> None:
        options = list(CHANNEL_OPTIONS) + list(extra)
        if channels > 1:  # separate subchannels, hence separate TCP connections
            options.append(("grpc.use_local_subchannel_pool", 1))
        self.clients = [
            SglangClient(
                grpc.aio.insecure_channel(grpc_target(url), options=options),
                1,
                open_streams(url) if http2 else None,
            )
            for _ in range(channels)
        ]
        self._turn = 0

    def generate(self, request: GenerateRequest) -> AsyncIterator[Any]:
        self._turn += 1
        return self.clients[self._turn % len(self.clients)].generate(request)

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


class AioRead(StreamClient):
    """The aio channel read with `await call.read()` (no async-generator layer of grpc's)."""

    def __init__(self, url: str) -> None:
        self.client = client_for("sglang", url, 1)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Any]:
        call = self.client.stub.Generate(self.client.build_request(request))
        eof = grpc.aio.EOF
        try:
            while True:
                reply = await call.read()
                if reply is eof:
                    return
                yield reply
        finally:
            call.cancel()

    async def close(self) -> None:
        await self.client.close()


_EOF = object()


class SyncThreaded(StreamClient):
    """The sync stub; each stream is iterated by a pool thread, replies cross to the loop."""

    def __init__(self, url: str, single_threaded: bool, threads: int = 256) -> None:
        options = list(CHANNEL_OPTIONS)
        if single_threaded:
            options.append((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1))
        self.channel = grpc.insecure_channel(grpc_target(url), options=options)
        self.stub = pb_grpc.SglangSchedulerStub(self.channel)
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="grpc-read")

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        call = self.stub.Generate(SglangClient.build_request(request))
        queue: collections.deque[Any] = collections.deque()
        waiter: list[asyncio.Future[None] | None] = [None]

        def deliver(item: Any) -> None:
            queue.append(item)
            w = waiter[0]
            if w is not None and not w.done():
                w.set_result(None)

        def pump() -> None:
            handoff = loop.call_soon_threadsafe
            try:
                for reply in call:
                    handoff(deliver, reply)
            except grpc.RpcError as exc:
                handoff(deliver, exc)
                return
            handoff(deliver, _EOF)

        self.pool.submit(pump)
        try:
            while True:
                if not queue:
                    waiter[0] = loop.create_future()
                    await waiter[0]
                item = queue.popleft()
                if item is _EOF:
                    return
                if isinstance(item, grpc.RpcError):
                    raise item
                yield item
        finally:
            call.cancel()

    async def close(self) -> None:
        self.channel.close()
        self.pool.shutdown(wait=True)


def _aio_opts(*extra: tuple[str, Any]) -> Opener:
    return lambda url: AioEngine(url, extra=list(extra))


@dataclass(frozen=True)
class Variant:
    open: Opener
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""


VARIANTS: dict[str, Variant] = {
    "aio": Variant(lambda url: AioEngine(url), note="today: EngineClient.generate, grpc.aio"),
    "aio-read": Variant(lambda url: AioRead(url), note="aio, await call.read() loop"),
    "aio-nochannelz": Variant(_aio_opts(("grpc.enable_channelz", 0)), note="enable_channelz 0"),
    "aio-nobdp": Variant(_aio_opts(("grpc.http2.bdp_probe", 0)), note="http2.bdp_probe 0"),
    "aio-minimal": Variant(_aio_opts(("grpc.minimal_stack", 1)), note="minimal_stack 1"),
    "aio-noreuseport": Variant(_aio_opts(("grpc.so_reuseport", 0)), note="so_reuseport 0"),
    "aio-nocompress": Variant(
        _aio_opts(("grpc.default_compression_algorithm", 0)), note="compression off"
    ),
    "http2": Variant(
        lambda url: AioEngine(url, http2=True),
        env={"GRPC_EXPERIMENTS": "-event_engine_client"},
        note="Generate over the loop's own HTTP/2 connection (engines/http2.py)",
    ),
    "aio-x4": Variant(lambda url: AioEngine(url, channels=4), note="4 channels per engine"),
    "poll": Variant(lambda url: AioEngine(url), env={"GRPC_POLL_STRATEGY": "poll"}),
    "aio-noee": Variant(
        lambda url: AioEngine(url),
        env={"GRPC_EXPERIMENTS": "-event_engine_client"},
        note="GRPC_EXPERIMENTS=-event_engine_client",
    ),
    "sync-st": Variant(
        lambda url: SyncThreaded(url, True), note="sync stub, SingleThreadedUnaryStream, threads"
    ),
    "sync-mt": Variant(lambda url: SyncThreaded(url, False), note="sync stub, default, threads"),
    # Its child runs under --ref-python, whose checkout's library answers the imports above.
    "aio-ref": Variant(lambda url: AioEngine(url), note="aio in the --ref-python checkout"),
}

REF_SUFFIX = "-ref"


def thread_cpu() -> dict[str, tuple[float, int]]:
    """(CPU seconds, voluntary context switches) of this process per thread name (gRPC's
    threads, the loop's, ...); threads that ended are not counted."""
    from pathlib import Path

    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, tuple[float, int]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        old = out.get(name, (0.0, 0))
        out[name] = (old[0] + cpu, old[1] + switches)
    return out


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sleeps() -> int:
    """Voluntary context switches of every thread so far: how often the process blocked and
    was woken up again (load on the machine changes it far less than CPU time)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


async def _closed_loop(
    client: StreamClient, concurrency: int, requests: int, tokens: int, tag: str, seconds: float
) -> tuple[list[float], list[float], int]:
    """`requests` streams, or as many as start in `seconds` when that is set."""
    sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    prompt = list(range(100, 132))
    counter = iter(range(1 << 62 if seconds else requests))
    deadline = time.perf_counter() + seconds
    latencies: list[float] = []
    ttfts: list[float] = []
    received = 0

    async def worker() -> None:
        nonlocal received
        for i in counter:
            if seconds and time.perf_counter() > deadline:
                return
            request = GenerateRequest(
                request_id=f"{tag}-{os.getpid()}-{i}",
                instance_id=1,
                token_ids=prompt,
                sampling=sampling,
            )
            start = time.perf_counter()
            first = 0.0
            async for _ in client.generate(request):
                received += 1
                if not first:
                    first = time.perf_counter()
            latencies.append(time.perf_counter() - start)
            ttfts.append(first - start)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, ttfts, received


async def _child(args: argparse.Namespace) -> dict[str, Any]:
    client = VARIANTS[args.variant].open(args.url)
    try:
        warm = max(args.concurrency * 2, 16)
        await _closed_loop(client, args.concurrency, warm, args.tokens, "warm", 0)
        if args.seconds:
            from hops import wait_go

            await wait_go()
        threads0 = thread_cpu()
        cpu0, wall0, sleeps0 = cpu_seconds(), time.perf_counter(), sleeps()
        lat, ttft, messages = await _closed_loop(
            client, args.concurrency, args.requests, args.tokens, "run", args.seconds
        )
        cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
        woken = sleeps() - sleeps0
        threads = {
            k: (v[0] - threads0.get(k, (0.0, 0))[0], v[1] - threads0.get(k, (0.0, 0))[1])
            for k, v in thread_cpu().items()
        }
    finally:
        await client.close()
    lat.sort()
    ttft.sort()
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "wakeups": woken,
        "requests": len(lat),
        "messages": messages,
        "lat_p50": lat[len(lat) // 2],
        "lat_p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "ttft_p50": ttft[len(ttft) // 2],
        "threads": {k: [round(v[0], 3), v[1]] for k, v in sorted(threads.items()) if any(v)},
    }


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--requests", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=0, help="measure this long after go")
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args(argv)
    if args.uvloop:
        import uvloop

        result = uvloop.run(_child(args))
    else:
        result = asyncio.run(_child(args))
    print(json.dumps(result))


def child_env(variant: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(VARIANTS[variant].env)
    return env


DEFAULT_VARIANTS = "aio-noee,http2,aio,sync-st"
QUICK_VARIANTS = "aio-noee,http2"


METRICS = [
    "cpu_us_per_msg",
    "cpu_ms_per_req",
    "wakeups_per_msg",
    "lat_p50_ms",
    "lat_p99_ms",
    "req_s",
]


class _Measured:
    def __init__(self, job: Any) -> None:
        self.job = job
        self.warmed = job.warmed
        self.go = job.go

    def result(self) -> dict[str, float]:
        return metrics(self.job.output())


def metrics(r: dict[str, Any]) -> dict[str, float]:
    return {
        "cpu_us_per_msg": r["cpu_s"] / r["messages"] * 1e6,
        "cpu_ms_per_req": r["cpu_s"] / r["requests"] * 1e3,
        "wakeups_per_msg": r["wakeups"] / r["messages"],
        "lat_p50_ms": r["lat_p50"] * 1e3,
        "lat_p99_ms": r["lat_p99"] * 1e3,
        "req_s": r["requests"] / r["wall_s"],
    }


def engine_argv(port: int) -> list[str]:
    """The SGLang-protocol mock engine with every delay at zero: tokens come as fast as it can."""
    zero = ["--ttft-ms", "0", "--itl-ms", "0", "--prefill-base-ms", "0"]
    zero += ["--prefill-ms-per-token", "0", "--batch-slowdown", "0"]
    return ["mock-engine", "--protocol", "sglang", "--port", str(port), *zero]


def run(args: argparse.Namespace, progress: Callable[[str], None]) -> tuple[list[Any], list[str]]:
    import tempfile
    from pathlib import Path

    from hops import ChildJob, Comparison, run_pairs
    from load import Processes, _engine_up

    from switchyard.common.ports import free_port

    quick = args.quick
    variants = (args.variants or (QUICK_VARIANTS if quick else DEFAULT_VARIANTS)).split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown gRPC variants: {unknown}; known: {sorted(VARIANTS)}")
    concurrencies = [
        int(c) for c in (args.concurrency or ("4" if quick else "1,32,128")).split(",")
    ]
    token_counts = [int(t) for t in (args.tokens or ("16" if quick else "16,128")).split(",")]
    rounds = args.rounds or (1 if quick else 3)
    seconds = args.seconds or (1.0 if quick else 6.0)
    ref_python = getattr(args, "ref_python", None)
    if any(v.endswith(REF_SUFFIX) for v in variants) and not ref_python:
        raise SystemExit("the *-ref variants need --ref-python")
    comparisons = []
    with tempfile.TemporaryDirectory(prefix="hops-grpc-") as tmp:
        procs = Processes(Path(tmp))
        try:
            port = free_port()
            engine = procs.start_switchyard("engine", *engine_argv(port), "--log-level", "WARNING")
            url = f"grpc://127.0.0.1:{port}"
            try:
                asyncio.run(_engine_up(url, 90.0))
            except Exception as exc:
                raise RuntimeError(f"mock engine did not start: {procs.log_tail(engine)}") from exc
            for concurrency in concurrencies:
                for tokens in token_counts:
                    comparison = Comparison(
                        "grpc",
                        f"c={concurrency} tokens={tokens}",
                        variants[0],
                        METRICS,
                    )

                    def launch(variant: str, c: int = concurrency, t: int = tokens) -> Any:
                        argv = ["hops_grpc.py", "--variant", variant, "--url", url, "--uvloop"]
                        argv += ["--concurrency", str(c), "--seconds", str(seconds)]
                        python = ref_python if variant.endswith(REF_SUFFIX) else None
                        job = ChildJob(
                            argv + ["--tokens", str(t)], env=child_env(variant), python=python
                        )
                        return _Measured(job)

                    comparisons.append(run_pairs(comparison, variants, rounds, launch, progress))
        finally:
            procs.stop_all()
    notes = [
        "Client process CPU per engine message (one token chunk each, plus the final one) and "
        "per request, against one SGLang-protocol mock engine with zero delays. "
        + "Variants: "
        + "; ".join(f"`{v}` {VARIANTS[v].note or VARIANTS[v].env}" for v in variants)
        + ".",
        "",
    ]
    return comparisons, notes


if __name__ == "__main__":
    child_main(sys.argv[1:])
