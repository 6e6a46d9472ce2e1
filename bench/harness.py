"""Shared pieces of the benchmarks: free ports, a stack in a child process, percentiles."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import httpx

from switchyard.common.ports import free_port


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def switchyard(*args: str, **popen: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "switchyard", *args], **popen)  # type: ignore[call-overload]


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the stack exited before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/ready", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the stack at {base} was not ready in {timeout}s")


@contextlib.contextmanager
def stack(*up_args: str) -> Iterator[str]:
    """`switchyard up` on a free HTTP port; yields its base URL, stops it at exit."""
    port = free_port()
    proc = switchyard(
        "up", "--http-port", str(port), "--log-level", "WARNING", *up_args, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        yield base
    finally:
        stop(proc)
