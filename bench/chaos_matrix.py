"""Chaos matrix: SIGKILL and SIGSTOP (then SIGCONT) each process kind of a `switchyard up`
stack under steady streaming load, and report per case what the clients saw.

    python bench/chaos_matrix.py                       # every kind, kill and stop
    python bench/chaos_matrix.py --kinds engine,router --faults stop --freeze-seconds 8

One stack per process kind (or all on `--one-stack`): 3 mock engines, fleet, and `--replicas`
(default 2) routers, dispatchers and preprocessors (sharing the HTTP port); `up` restarts
what dies. Each stack first runs every prompt once undisturbed (the expected texts: the mock
engines are deterministic per context) and streams a fault-free steady load (the baseline:
the p99 of a stream's duration); then, for each fault, `--clients` openai-SDK clients stream
back to back for `--load-seconds`, and the fault hits one process of the kind `--fault-at`
seconds in (a stopped one gets SIGCONT after `--freeze-seconds`).

Per case: streams run; failed streams, split into those on a connection the killed
preprocessor had accepted (its own requests: the only ones allowed to fail) and every other
failure; streams whose text differs from the undisturbed run; the longest gap a client saw
(time to first token, or between two chunks); streams slower than twice the baseline p99;
and the time back to normal: from the fault to the end of the last stream that was slower
than that, or failed without being the killed ingress's (0 when none was). Which connections
a preprocessor held is read from /proc (its socket fds against /proc/net/tcp) while it is
stopped, just before the SIGKILL: a connection still in the kernel's accept queue is nobody's
yet, and a request on it must not fail.

`--legacy` drives an older checkout's `up` (no --ready-file / port 0): run it with that
checkout's python for a "before" column.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import httpx2
import openai

MODEL = "deepseek-mock"
KINDS = ("engine", "dispatcher", "router", "fleet", "preprocessor")
FAULTS = ("kill", "stop")
# The process of each kind that is hit: the `switchyard` subcommand it runs.
TARGET = {
    "engine": "mock-engine",
    "dispatcher": "dispatcher",
    "router": "router",
    "fleet": "fleet",
    "preprocessor": "preprocessor",
}
SLOW = 2.0  # a stream slower than this many times the baseline p99 is not back to normal


@dataclass
class Outcome:
    prompt: int
    text: str = ""
    failed: str = ""  # the error, for a failed stream
    longest_gap: float = 0.0  # seconds: to the first chunk, or between two chunks
    start: float = 0.0  # monotonic
    end: float = 0.0
    port: int = 0  # the client's local port of the connection the stream went over


@dataclass
class Case:
    kind: str
    fault: str
    outcomes: list[Outcome] = field(default_factory=list)
    expected: dict[int, str] = field(default_factory=dict)
    fault_at: float = 0.0  # monotonic
    held: frozenset[int] = frozenset()  # client ports of the connections the victim held
    baseline_p99: float = 0.0  # seconds, a stream's duration undisturbed

    @property
    def failed(self) -> int:
        return sum(1 for o in self.outcomes if o.failed)

    @property
    def failed_held(self) -> int:
        """Failed streams on a connection the killed process had accepted."""
        return sum(1 for o in self.outcomes if o.failed and o.port in self.held)

    @property
    def failed_other(self) -> int:
        return self.failed - self.failed_held

    @property
    def different(self) -> int:
        return sum(1 for o in self.outcomes if not o.failed and o.text != self.expected[o.prompt])

    @property
    def longest_gap(self) -> float:
        return max((o.longest_gap for o in self.outcomes if not o.failed), default=0.0)

    def slow(self) -> list[Outcome]:
        limit = SLOW * self.baseline_p99
        return [o for o in self.outcomes if not o.failed and o.end - o.start > limit]

    @property
    def recovery(self) -> float:
        """Seconds from the fault to the end of the last stream that was not normal (slow,
        or failed without being the killed ingress's); 0 when every one was."""
        late = [o for o in self.slow() if o.end > self.fault_at]
        late += [o for o in self.outcomes if o.failed and o.port not in self.held]
        return max((o.end - self.fault_at for o in late), default=0.0)


def prompt(n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Stream {n}: list the sidings of yard {n * 7}."}]


class TracedClient:
    """An openai client whose HTTP client records the local port of each connection it opens
    (one stream at a time per client: the latest connection is the one in use)."""

    def __init__(self, base: str, new_connections: bool = False) -> None:
        self.port = 0

        async def trace(name: str, info: dict) -> None:
            if name.endswith("connect_tcp.complete"):
                self.port = info["return_value"].get_extra_info("client_addr")[1]

        async def hook(request: httpx2.Request) -> None:
            request.extensions["trace"] = trace

        # No keep-alive: each stream opens a connection (as many independent clients do).
        limits = httpx2.Limits(max_keepalive_connections=0 if new_connections else 20)
        self.http = httpx2.AsyncClient(event_hooks={"request": [hook]}, timeout=120, limits=limits)
        self.openai = openai.AsyncOpenAI(
            base_url=base + "/v1", api_key="none", max_retries=0, timeout=120, http_client=self.http
        )

    async def __aenter__(self) -> TracedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.openai.close()
        await self.http.aclose()


async def one_stream(traced: TracedClient, n: int, max_tokens: int) -> Outcome:
    client = traced.openai
    last = time.monotonic()
    outcome = Outcome(n, start=last)
    parts: list[str] = []
    try:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=prompt(n),  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        finish = None
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    now = time.monotonic()
                    outcome.longest_gap = max(outcome.longest_gap, now - last)
                    last = now
                    parts.append(choice.delta.content)
                if choice.finish_reason:
                    finish = choice.finish_reason
        if finish != "length":
            outcome.failed = f"finish_reason {finish!r}"
    except (openai.APIError, httpx.HTTPError, httpx2.HTTPError) as exc:
        outcome.failed = f"{type(exc).__name__}: {exc}"
    outcome.text = "".join(parts)
    outcome.end = time.monotonic()
    outcome.port = traced.port
    return outcome


async def steady_load(
    base: str,
    clients: int,
    prompts: int,
    seconds: float,
    max_tokens: int,
    fault=None,
    new_connections: bool = False,
) -> list[Outcome]:
    """`clients` loops streaming back to back for `seconds`; `fault()` (blocking) runs in a
    thread meanwhile. Every stream started is awaited."""
    stop_at = time.monotonic() + seconds
    outcomes: list[Outcome] = []

    async def loop(c: int) -> None:
        async with TracedClient(base, new_connections) as client:
            turn = 0
            while time.monotonic() < stop_at:
                n = (c + turn * clients) % prompts
                outcomes.append(await one_stream(client, n, max_tokens))
                turn += 1

    tasks = [asyncio.create_task(loop(c)) for c in range(clients)]
    if fault is not None:
        await asyncio.to_thread(fault)
    await asyncio.gather(*tasks)
    return outcomes


async def every_prompt_once(base: str, prompts: int, clients: int, max_tokens: int) -> list:
    sem = asyncio.Semaphore(clients)
    async with TracedClient(base) as client:

        async def one(n: int) -> Outcome:
            async with sem:
                return await one_stream(client, n, max_tokens)

        return await asyncio.gather(*(one(n) for n in range(prompts)))


# ---- the stack --------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    return [int(p) for p, pp in (line.split() for line in out.splitlines()) if int(pp) == pid]


def target_pids(up_pid: int, kind: str) -> list[int]:
    """The children of `up` running the kind's subcommand (`python -m switchyard <kind>`)."""
    found = []
    for pid in sorted(_children(up_pid)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 3 and argv[3].decode() == TARGET[kind]:
            found.append(pid)
    return found


def target_pid(up_pid: int, kind: str) -> int | None:
    """The first one (engine 0, preprocessor 0)."""
    pids = target_pids(up_pid, kind)
    return pids[0] if pids else None


def held_peer_ports(pid: int) -> frozenset[int]:
    """The remote ports of the TCP connections process `pid` holds a descriptor of (accepted
    or dialed; listening sockets left out). A connection in a listening socket's accept queue
    has no descriptor yet, so it is nobody's."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[9] in inodes and cols[3] != "0A":  # 0A: LISTEN
                    ports.add(int(cols[2].rsplit(":", 1)[1], 16))
    return frozenset(ports)


def workers(base: str) -> int:
    try:
        body = {"model": MODEL, "prompt": "x"}
        reply = httpx.post(base + "/debug/route", json=body, timeout=5)
    except httpx.HTTPError:
        return 0
    return len(reply.json().get("workers", [])) if reply.status_code == 200 else 0


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def healthy(base: str, up_pid: int, engines: int, replicas: int) -> bool:
    if workers(base) != engines:
        return False
    expected = {"engine": engines, "fleet": 1}
    return all(len(target_pids(up_pid, k)) == expected.get(k, replicas) for k in KINDS)


@contextlib.contextmanager
def up_stack(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    log = tempfile.NamedTemporaryFile(prefix="chaos-up-", suffix=".log", delete=False)
    argv = [sys.executable, "-m", "switchyard", "up", "--mock-engines", "sglang,vllm,sglang"]
    for kind in ("preprocessors", "routers", "dispatchers"):
        argv += [f"--{kind}", str(args.replicas)]
    argv += ["--mock-itl-ms", str(args.itl_ms), "--mock-ttft-ms", "5"]
    argv += ["--log-level", "WARNING"]
    argv += [f"--preprocessor-arg={a}" for a in args.preprocessor_arg]
    if args.legacy:
        from switchyard.common.ports import free_port

        argv += ["--http-port", str(free_port())]
    else:
        argv += ["--http-port", "0", "--log-level", "INFO"]
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        base = ""
        deadline = time.monotonic() + 120
        while not base:
            text = Path(log.name).read_text(errors="replace")
            if args.legacy:
                base = f"http://127.0.0.1:{argv[argv.index('--http-port') + 1]}"
            elif "the API will be on " in text:
                base = text.split("the API will be on ", 1)[1].split()[0].removesuffix("/v1")
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"switchyard up did not start:\n{text[-3000:]}")
            time.sleep(0.1)
        wait_for(lambda: healthy(base, proc.pid, 3, args.replicas), 120, "every engine routable")
        yield base, proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        os.unlink(log.name)


def run_kinds(args: argparse.Namespace, kinds: list[str]) -> list[Case]:
    """Every fault on each kind, on one stack (recovered between cases)."""
    cases = []
    with up_stack(args) as (base, up_pid):
        calm = asyncio.run(every_prompt_once(base, args.prompts, args.clients, args.max_tokens))
        bad = [o for o in calm if o.failed]
        if bad:
            raise RuntimeError(f"the undisturbed run failed: {bad[0].failed}")
        expected = {o.prompt: o.text for o in calm}
        steady = asyncio.run(
            steady_load(
                base,
                args.clients,
                args.prompts,
                args.load_seconds,
                args.max_tokens,
                new_connections=args.new_connections,
            )
        )
        if any(o.failed for o in steady):
            raise RuntimeError("the fault-free steady load failed")
        p99 = percentile([o.end - o.start for o in steady], 99)
        for kind, fault in ((k, f) for k in kinds for f in args.faults for _ in range(args.repeat)):
            pid = target_pid(up_pid, kind)
            if pid is None:
                raise RuntimeError(f"no {kind} process to hit")
            case = Case(kind, fault, expected=expected, baseline_p99=p99)

            def hit(pid: int = pid, case: Case = case) -> None:
                time.sleep(args.fault_at)
                # Stopped first, so that what it holds cannot change before it dies.
                os.kill(pid, signal.SIGSTOP)
                case.fault_at = time.monotonic()
                if case.fault == "kill":
                    case.held = held_peer_ports(pid)
                    os.kill(pid, signal.SIGKILL)
                else:
                    time.sleep(args.freeze_seconds)
                    os.kill(pid, signal.SIGCONT)

            case.outcomes = asyncio.run(
                steady_load(
                    base,
                    args.clients,
                    args.prompts,
                    args.load_seconds,
                    args.max_tokens,
                    hit,
                    args.new_connections,
                )
            )
            cases.append(case)
            # The next case starts on a whole stack again (`up` restarted what died).
            wait_for(
                lambda: healthy(base, up_pid, 3, args.replicas),
                120,
                f"the stack to recover from {kind}",
            )
    return cases


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))] if ordered else 0.0


def table(cases: list[Case]) -> str:
    lines = [
        "| process | fault | streams | failed: its own / others | different text | "
        "longest client gap | slow (> 2x p99) | back to normal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        lines.append(
            f"| {c.kind} | {'SIGKILL' if c.fault == 'kill' else 'SIGSTOP+SIGCONT'} | "
            f"{len(c.outcomes)} | {c.failed_held} / {c.failed_other} | {c.different} | "
            f"{c.longest_gap:.2f} s | {len(c.slow())} | {c.recovery:.2f} s |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--replicas", type=int, default=2, help="routers, dispatchers and preprocessors each"
    )
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--load-seconds", type=float, default=6.0)
    parser.add_argument("--fault-at", type=float, default=1.0)
    parser.add_argument("--freeze-seconds", type=float, default=4.0)
    parser.add_argument(
        "--preprocessor-arg",
        action="append",
        default=[],
        help="passed to every preprocessor (e.g. --preprocessor-arg=--stream-gap-timeout=1)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="each case this many times")
    parser.add_argument(
        "--new-connections",
        action="store_true",
        help="every stream on a new connection (default: each client keeps its connection)",
    )
    parser.add_argument(
        "--one-stack",
        action="store_true",
        help="every kind on one stack, recovered between cases (quicker; default: one each)",
    )
    parser.add_argument("--legacy", action="store_true", help="an older `up` (see the docstring)")
    parser.add_argument("--json", type=Path, default=None, help="also write the cases here")
    args = parser.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    args.faults = [f for f in args.faults.split(",") if f]
    for k in args.kinds:
        if k not in KINDS:
            parser.error(f"unknown kind {k!r}")
    for f in args.faults:
        if f not in FAULTS:
            parser.error(f"unknown fault {f!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases: list[Case] = []
    if args.one_stack:
        cases = run_kinds(args, args.kinds)
    else:
        for kind in args.kinds:
            cases += run_kinds(args, [kind])
    print(
        f"{args.clients} openai-SDK clients streaming back to back ({args.max_tokens} tokens, "
        f"{args.itl_ms:g} ms/token{', a new connection each' if args.new_connections else ''}), "
        f"3 mock engines, fleet, {args.replicas} of each other service; fault at "
        f"{args.fault_at:g} s of {args.load_seconds:g} s, SIGCONT after {args.freeze_seconds:g} s; "
        f"preprocessor flags: {' '.join(args.preprocessor_arg) or 'defaults'}\n"
    )
    print(table(cases))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "kind": c.kind,
                        "fault": c.fault,
                        "streams": len(c.outcomes),
                        "failed": c.failed,
                        "failed_held": c.failed_held,
                        "failed_other": c.failed_other,
                        "different": c.different,
                        "longest_gap_s": round(c.longest_gap, 3),
                        "baseline_p99_s": round(c.baseline_p99, 3),
                        "slow": len(c.slow()),
                        "recovery_s": round(c.recovery, 3),
                        "errors": sorted({o.failed for o in c.outcomes if o.failed})[:5],
                        "other_errors": sorted(
                            {o.failed for o in c.outcomes if o.failed and o.port not in c.held}
                        )[:5],
                    }
                    for c in cases
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
