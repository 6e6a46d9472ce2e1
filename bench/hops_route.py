"""The route round trip: the preprocessor's RouterClient against a real router process.

Two SGLang-protocol mock engines and one fleet are shared by every run; each run starts its
own router process (the variant's endpoint and code) and a client child that drives the real
`RouterClient` (services/preprocessor/router_client.py) the way the preprocessor does for each
request: route, then the first-token and the finished progress notices, with a short random
pause between them (the stream). The client measures its own CPU (getrusage) and reads the
router's from /proc, both over the measured window; latency is route()'s round trip.

Variants (each with `switchyard router`, kv policy):
  now              today: tcp://127.0.0.1:P; the first route request of a loop iteration goes
                   at once (with the notices queued before it), the rest of what the client
                   has for the router in that iteration on the next one as one message (a
                   list), answered by one list
  batched          the client before: everything, the first route request too, on the next
                   loop iteration as one message
  one-per-message  the client before that: every message sent at once, on its own
  now-ipc          today's client and router on an ipc:// endpoint

`--busy-us N` gives the client's loop other work: a task that holds it N us in every
iteration, as a loaded preprocessor's other requests (their stages, their token batches) do;
what waits for the next iteration waits for that too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from procstat import read_stat

from switchyard.protos.messages import RouteRequest

MODEL = "deepseek-mock"


def usage() -> tuple[float, int]:
    """(CPU seconds, voluntary context switches) of every thread of this process so far."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_nvcsw


def proc_usage(pid: int) -> tuple[float, int]:
    """The same for another process, from /proc (CPU in clock ticks)."""
    from pathlib import Path

    stat = read_stat(pid)
    if stat is None:
        raise RuntimeError(f"process {pid} is gone")
    switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    switches += int(line.split()[1])
        except OSError:
            continue
    return stat[1], switches


# --- the client as it was before batching ------------------------------------------------


def _one_per_message_client(endpoints: list[str]) -> Any:
    """A RouterClient whose DEALERs send every message at once, on its own (the client before
    it batched per loop iteration; the router answers a lone request with a lone reply)."""
    from switchyard.common.messaging import DealerClient
    from switchyard.preprocessor import router_client as rc

    class OnePerMessage(rc._Router):
        send_now = DealerClient.send_now

    rc._Router = OnePerMessage  # type: ignore[misc]  # this child process only
    return rc.RouterClient(endpoints, dict)


def _batched_client(endpoints: list[str]) -> Any:
    """A RouterClient whose DEALERs send everything on the next loop iteration, the first
    route request too (the client before route requests went at once)."""
    from switchyard.preprocessor import router_client as rc

    class Batched(rc._Router):
        def send_now(self, message: Any) -> None:
            self._queued.append(message)
            if not self._tick_pending:
                self._tick_pending = True
                asyncio.get_running_loop().call_soon(self._tick)

    rc._Router = Batched  # type: ignore[misc]  # this child process only
    return rc.RouterClient(endpoints, dict)


async def _hold_the_loop(busy_us: float) -> None:
    """Hold the loop `busy_us` in every iteration (a loaded preprocessor's other work)."""
    while True:
        end = time.perf_counter() + busy_us / 1e6
        while time.perf_counter() < end:
            pass
        await asyncio.sleep(0)


# --- the client child ----------------------------------------------------------------------


async def _drive(args: argparse.Namespace) -> dict[str, Any]:
    from switchyard.preprocessor.router_client import FALLBACK_POLICY, RouterClient
    from switchyard.protos.messages import STAGE_FINISHED, STAGE_FIRST_TOKEN

    if args.client == "one-per-message":
        client = _one_per_message_client([args.endpoint])
    elif args.client == "batched":
        client = _batched_client([args.endpoint])
    else:
        client = RouterClient([args.endpoint], dict)
    client.start()
    if not await client.wait_connected(60):
        raise RuntimeError("router not connected")
    rng = random.Random(7)
    # Prompts made up front: building token ids is the preprocessor's work, not the hop's.
    prompts = [[rng.randrange(1000, 30000) for _ in range(args.prompt_tokens)] for _ in range(256)]
    ids = iter(range(1 << 62))
    latencies: list[float] = []
    fallbacks = 0

    async def one() -> None:
        nonlocal fallbacks
        n = next(ids)
        rid = f"r{n}"
        request = RouteRequest(request_id=rid, model=MODEL, token_ids=prompts[n % len(prompts)])
        start = time.perf_counter()
        reply = await client.route(request, 10.0)
        latencies.append(time.perf_counter() - start)
        if reply.policy == FALLBACK_POLICY or reply.instance_id is None:
            fallbacks += 1
            return
        await asyncio.sleep(rng.random() * args.pause_ms / 1e3)
        await client.progress(rid, reply.instance_id, STAGE_FIRST_TOKEN, final=False)
        await asyncio.sleep(rng.random() * args.pause_ms / 1e3)
        await client.progress(rid, reply.instance_id, STAGE_FINISHED, final=True)

    async def worker(count: int, deadline: float = 0.0) -> None:
        if deadline:
            while time.perf_counter() < deadline:
                await one()
        else:
            for _ in range(count):
                await one()

    # Warm up until the router knows the engines (its first answers may say no_worker).
    for _ in range(600):
        fallbacks = 0
        await worker(1)
        if not fallbacks:
            break
        await asyncio.sleep(0.1)
    await asyncio.gather(*(worker(20) for _ in range(args.concurrency)))
    latencies.clear()
    fallbacks = 0
    from hops import wait_go

    await wait_go()
    busy = asyncio.create_task(_hold_the_loop(args.busy_us)) if args.busy_us > 0 else None
    router0 = proc_usage(args.router_pid)
    (cpu0, sleeps0), wall0 = usage(), time.perf_counter()
    await asyncio.gather(*(worker(0, wall0 + args.seconds) for _ in range(args.concurrency)))
    (cpu1, sleeps1), wall = usage(), time.perf_counter() - wall0
    router1 = proc_usage(args.router_pid)
    if busy is not None:
        busy.cancel()
    await client.close()
    latencies.sort()
    return {
        "client_cpu_s": cpu1 - cpu0,
        "router_cpu_s": router1[0] - router0[0],
        "wakeups": sleeps1 - sleeps0 + router1[1] - router0[1],
        "wall_s": wall,
        "requests": len(latencies),
        "fallbacks": fallbacks,
        "lat_p50": latencies[len(latencies) // 2],
        "lat_p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "lat_mean": statistics.fmean(latencies),
    }


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--router-pid", type=int, required=True)
    parser.add_argument("--client", choices=("now", "batched", "one-per-message"), default="now")
    parser.add_argument("--busy-us", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--pause-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    import uvloop

    print(json.dumps(uvloop.run(_drive(args))))


# --- the parent ----------------------------------------------------------------------------

VARIANTS = {  # transport, client
    "now": ("tcp", "now"),
    "batched": ("tcp", "batched"),
    "one-per-message": ("tcp", "one-per-message"),
    "now-ipc": ("ipc", "now"),
}
DEFAULT_VARIANTS = "now,batched,one-per-message,now-ipc"
QUICK_VARIANTS = "now,batched"


class _Run:
    """A router process for the variant, then a client child (a ChildJob) against it."""

    def __init__(
        self, variant: str, ctx: dict[str, Any], concurrency: int, seconds: float, busy_us: float
    ) -> None:
        from hops import ChildJob

        from switchyard.common.ports import free_port

        transport, client = VARIANTS[variant]
        procs = ctx["procs"]
        self.procs = procs
        if transport == "tcp":
            endpoint = f"tcp://127.0.0.1:{free_port()}"
        else:
            endpoint = f"ipc://{ctx['tmp']}/router-{time.monotonic_ns()}.sock"
        flags = ["--bind", endpoint, "--fleet-control", ctx["control"]]
        flags += ["--fleet-events", ctx["events"], "--router-mode", "kv", "--log-level", "WARNING"]
        name = f"router-{variant}-{time.monotonic_ns()}"
        self.router = procs.start_switchyard(name, "router", *flags)
        argv = ["hops_route.py", "--endpoint", endpoint, "--router-pid", str(self.router.pid)]
        argv += ["--concurrency", str(concurrency), "--seconds", str(seconds)]
        self.client = ChildJob(argv + ["--client", client, "--busy-us", str(busy_us)])
        self.warmed = self.client.warmed
        self.go = self.client.go

    def result(self) -> dict[str, float]:
        try:
            r = self.client.output()
        finally:
            self.procs.stop(self.router)
        n = r["requests"]
        if r["fallbacks"]:
            raise RuntimeError(f"{r['fallbacks']} requests were routed locally (router gone?)")
        return {
            "cpu_us_per_req": (r["client_cpu_s"] + r["router_cpu_s"]) / n * 1e6,
            "client_us_per_req": r["client_cpu_s"] / n * 1e6,
            "router_us_per_req": r["router_cpu_s"] / n * 1e6,
            "wakeups_per_req": r["wakeups"] / n,
            "lat_p50_us": r["lat_p50"] * 1e6,
            "lat_p99_us": r["lat_p99"] * 1e6,
            "req_s": n / r["wall_s"],
        }


def run(args: argparse.Namespace, progress: Callable[[str], None]) -> tuple[list[Any], list[str]]:
    from pathlib import Path

    from hops import Comparison, run_pairs
    from load import Processes, _engine_up

    from switchyard.common.ports import free_port

    quick = args.quick
    variants = (args.variants or (QUICK_VARIANTS if quick else DEFAULT_VARIANTS)).split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown route variants: {unknown}; known: {sorted(VARIANTS)}")
    concurrencies = [int(c) for c in (args.concurrency or ("4" if quick else "1,64")).split(",")]
    rounds = args.rounds or (1 if quick else 3)
    seconds = args.seconds or (0.5 if quick else 4.0)
    comparisons = []
    with tempfile.TemporaryDirectory(prefix="hops-route-") as tmp:
        procs = Processes(Path(tmp))
        try:
            urls = []
            for index in range(2):
                port = free_port()
                argv = ["mock-engine", "--protocol", "sglang", "--port", str(port)]
                procs.start_switchyard(f"engine-{index}", *argv, "--log-level", "WARNING")
                urls.append(f"grpc://127.0.0.1:{port}")
            for url in urls:
                asyncio.run(_engine_up(url, 90.0))
            control = f"tcp://127.0.0.1:{free_port()}"
            events = f"tcp://127.0.0.1:{free_port()}"
            fleet = ["fleet", "--control", control, "--events", events, "--log-level", "WARNING"]
            for url in urls:
                fleet += ["--worker", url]
            procs.start_switchyard("fleet", *fleet)
            ctx = {"procs": procs, "tmp": tmp, "control": control, "events": events}
            for concurrency in concurrencies:
                comparison = Comparison(
                    "route",
                    f"c={concurrency}",
                    variants[0],
                    ["cpu_us_per_req", "client_us_per_req", "router_us_per_req",
                     "wakeups_per_req", "lat_p50_us", "lat_p99_us", "req_s"],
                )  # fmt: skip

                def launch(variant: str, c: int = concurrency) -> _Run:
                    return _Run(variant, ctx, c, seconds, args.busy_us)

                comparisons.append(run_pairs(comparison, variants, rounds, launch, progress))
        finally:
            procs.stop_all()
    notes = [
        "Per routed request: route(), its reply, and the two progress notices (first token, "
        "finished), 256-token prompts, kv policy over two mock engines (no KV events). CPU "
        "of the client process (getrusage) + the router process (/proc, 10 ms ticks). "
        f"The client's loop's other work: {args.busy_us:g} us per iteration (--busy-us).",
        "",
    ]
    return comparisons, notes


if __name__ == "__main__":
    child_main(sys.argv[1:])
