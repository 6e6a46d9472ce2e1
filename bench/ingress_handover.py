"""What a dying preprocessor replica costs the connections queued for it, per listening-socket
strategy, and how each strategy spreads connections over the replicas.

    python bench/ingress_handover.py                        # every mode, 5 trials each
    python bench/ingress_handover.py --modes group,shared --trials 10 --burst 64

Modes (two preprocessors each, in front of one `switchyard up` back end: mock engines,
fleet, a router, a dispatcher):
- group: what `switchyard up` does. This script binds one SO_REUSEPORT socket per replica
  and holds them; each replica accepts from its own (`--listen-fd`) and takes over what
  waits in the other's (`--standby-fd`, after 50 ms).
- shared: one listening socket, bound by this script and inherited by both (`--listen-fd`):
  one accept queue.
- reuseport: each binds its own socket with SO_REUSEPORT (`--reuse-port`): the kernel hashes
  each new connection to one of the listeners, each with its own accept queue.
- reuseport+migrate: the same inside a fresh network namespace (`unshare --net`, root) where
  net.ipv4.tcp_migrate_req=1: the kernel moves a closed listener's queue to another one.

A trial: preprocessor 0 is stopped (SIGSTOP: it accepts nothing), a burst of requests is
sent, each on a new connection; `--hold` seconds later preprocessor 0 is killed (SIGKILL)
and every request is awaited. A stopped process holds no connection it could have been
serving, so every failure is a request lost from a queue. Then preprocessor 0 is started
again. The spread, before the trials: `--spread` rounds of 16 keep-alive clients that connect
at once and send 4 requests each (what a benchmark client or a pooled SDK does), counted per
replica from their metrics: the lesser replica's share of the round (50% is even).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
from harness import started, stop

from switchyard.common.ports import bind_tcp, read_ready_file
from switchyard.preprocessor.listener import BACKLOG, listen_group

MODES = ("group", "shared", "reuseport", "reuseport+migrate")
MODEL = "deepseek-mock"
MIGRATE_SYSCTL = Path("/proc/sys/net/ipv4/tcp_migrate_req")


def loopback_up() -> None:
    """`ip link set lo up` (a new network namespace starts with lo down)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


class Replicas:
    """Two preprocessors of one mode, started and restarted by this script."""

    def __init__(self, mode: str, backend: dict[str, Any], folder: Path) -> None:
        self.mode = mode
        self.folder = folder
        children = backend["children"]
        self.flags = ["--host", "127.0.0.1", "--admin-port", "0", "--metrics-port", "off"]
        self.flags += ["--fleet-control", children["fleet"]["control"]]
        self.flags += ["--fleet-events", children["fleet"]["events"]]
        self.flags += ["--router", children["router-0"]["bind"]]
        self.flags += ["--dispatcher", children["dispatcher-0"]["bind"]]
        self.flags += ["--log-level", "WARNING", "--no-access-log"]
        self.held: list[socket.socket] = []  # the listening sockets this script holds
        self.port = 0
        if mode == "group":
            self.held = listen_group("127.0.0.1", 0, 2)
        elif mode == "shared":
            self.held = [bind_tcp("127.0.0.1", 0)]
            self.held[0].listen(BACKLOG)
            self.held[0].set_inheritable(True)
        if self.held:
            self.port = self.held[0].getsockname()[1]
        self.procs: list[subprocess.Popen[bytes] | None] = [None, None]
        self.admin: list[int] = [0, 0]

    def start(self, index: int) -> None:
        ready = self.folder / f"pre-{index}.json"
        ready.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "switchyard", "preprocessor", *self.flags]
        pass_fds = tuple(sock.fileno() for sock in self.held)
        if self.mode == "group":
            argv += ["--listen-fd", str(pass_fds[index]), "--standby-fd", str(pass_fds[1 - index])]
        elif self.mode == "shared":
            argv += ["--listen-fd", str(pass_fds[0])]
        else:
            argv += ["--reuse-port", "--port", str(self.port)]
        argv += ["--ready-file", str(ready)]
        proc = subprocess.Popen(argv, pass_fds=pass_fds, stdin=subprocess.DEVNULL)
        self.procs[index] = proc
        report = read_ready_file(ready, proc, 120)
        self.port = report["port"]
        self.admin[index] = report["admin_port"]

    def wait_ready(self, index: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.admin[index]}/ready"
        while True:
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(url, timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"preprocessor {index} not ready in {timeout:g} s")
            time.sleep(0.1)

    def served(self, index: int) -> float:
        text = httpx2.get(f"http://127.0.0.1:{self.admin[index]}/metrics", timeout=10).text
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("switchyard_preprocessor_requests_total{")
        )

    def close(self) -> None:
        stop(*[p for p in self.procs if p is not None])
        for sock in self.held:
            sock.close()


async def request(port: int, n: int) -> tuple[str, float]:
    """One chat request on a new connection: ('' when it succeeded, else the error; its
    seconds)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"burst {n}"}],
        "max_tokens": 2,
    }
    start = time.monotonic()
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            reply = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
        error = "" if reply.status_code == 200 else f"HTTP {reply.status_code}"
    except httpx2.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return error, time.monotonic() - start


async def burst(replicas: Replicas, size: int, hold: float) -> list[tuple[str, float]]:
    proc = replicas.procs[0]
    assert proc is not None
    tasks = [asyncio.create_task(request(replicas.port, n)) for n in range(size)]
    await asyncio.sleep(hold)
    proc.kill()
    return await asyncio.gather(*tasks)


async def spread(replicas: Replicas, clients: int, requests: int) -> None:
    """`clients` keep-alive clients, connecting at once, `requests` requests each."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "spread"}], "max_tokens": 2}
    url = f"http://127.0.0.1:{replicas.port}/v1/chat/completions"

    async def client() -> None:
        async with httpx2.AsyncClient(timeout=60) as http:
            for _ in range(requests):
                (await http.post(url, json=body)).raise_for_status()

    await asyncio.gather(*(client() for _ in range(clients)))


def run_mode(mode: str, args: argparse.Namespace, backend: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ingress-") as folder:
        replicas = Replicas(mode, backend, Path(folder))
        try:
            for index in (0, 1):
                replicas.start(index)
            for index in (0, 1):
                replicas.wait_ready(index)
            shares = []
            for _ in range(args.spread):
                before = [replicas.served(i) for i in (0, 1)]
                asyncio.run(spread(replicas, 16, 4))
                after = [replicas.served(i) for i in (0, 1)]
                shares.append(min(a - b for a, b in zip(after, before, strict=True)) / 64)
            lost, slowest = [], []
            for _ in range(args.trials):
                proc = replicas.procs[0]
                assert proc is not None
                os.kill(proc.pid, signal.SIGSTOP)
                outcomes = asyncio.run(burst(replicas, args.burst, args.hold))
                proc.wait()
                lost.append(sum(1 for error, _ in outcomes if error))
                slowest.append(round(max(s for error, s in outcomes if not error), 2))
                replicas.start(0)
                replicas.wait_ready(0)
            return {
                "mode": mode,
                "lost": lost,
                "slowest_served_s": slowest,
                "burst": args.burst,
                "spread": shares,
            }
        finally:
            replicas.close()


@contextlib.contextmanager
def backend() -> Iterator[dict[str, Any]]:
    proc, report = started(
        "up", "--mock-engines", "sglang,vllm", "--http-port", "0", "--log-level", "WARNING",
        "--mock-ttft-ms", "5", "--mock-itl-ms", "5", "--no-metrics",
        timeout=180, start_new_session=True,
    )  # fmt: skip
    try:
        yield report
    finally:
        stop(proc)


def in_namespace(args: argparse.Namespace) -> dict[str, Any]:
    """reuseport+migrate: this script again, in a new network namespace with the sysctl set."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = ["unshare", "--net", "--", sys.executable, __file__, "--modes", "reuseport"]
        argv += ["--trials", str(args.trials), "--burst", str(args.burst)]
        argv += ["--hold", str(args.hold), "--spread", str(args.spread)]
        argv += ["--json", out.name, "--set-migrate-req"]
        subprocess.run(argv, check=True, cwd=Path(__file__).parent)
        result: dict[str, Any] = json.loads(Path(out.name).read_text())[0]
    result["mode"] = "reuseport+migrate"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--burst", type=int, default=32, help="requests per trial")
    parser.add_argument("--hold", type=float, default=1.0, help="seconds before the kill")
    parser.add_argument(
        "--spread", type=int, default=5, help="rounds of 16 keep-alive clients (4 requests each)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--set-migrate-req", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}")
    if args.set_migrate_req:  # inside the namespace in_namespace made
        loopback_up()
        MIGRATE_SYSCTL.write_text("1\n")
    results = []
    local = [m for m in modes if m != "reuseport+migrate"]
    if local:
        with backend() as report:
            results += [run_mode(mode, args, report) for mode in local]
    if "reuseport+migrate" in modes:
        results.append(in_namespace(args))
    print(
        f"load average {os.getloadavg()[0]:.1f}; burst of {args.burst} requests on new "
        f"connections, preprocessor 0 stopped, killed {args.hold:g} s later\n"
    )
    print(
        "| mode | requests lost per trial | slowest served (s) | "
        "the lesser replica's share, 16 keep-alive clients |"
    )
    print("|---|---|---|---|")
    for r in results:
        print(
            f"| {r['mode']} | {', '.join(map(str, r['lost']))} of {r['burst']} | "
            f"{', '.join(map(str, r['slowest_served_s']))} | "
            f"{', '.join(f'{share:.0%}' for share in r['spread'])} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
