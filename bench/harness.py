"""Shared pieces of the benchmarks: a stack in a child process, percentiles.

Every process a benchmark starts binds its own ports (port 0) and reports them in a ready
file (`started`); no port is picked here and bound by a child."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from switchyard.common.ports import free_port, read_ready_file

__all__ = ["free_port", "pct", "stack", "started", "stop", "switchyard", "wait_ready"]


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def switchyard(*args: str, python: str | None = None, **popen: object) -> subprocess.Popen[bytes]:
    """`switchyard <args>` with this interpreter, or `python` (another checkout's venv)."""
    exe = python or sys.executable
    return subprocess.Popen([exe, "-m", "switchyard", *args], **popen)  # type: ignore[call-overload]


def started(*args: str, timeout: float = 60.0, **popen: object):
    """`switchyard <args> --ready-file F`: (process, what it reports it bound)."""
    with tempfile.TemporaryDirectory(prefix="bench-") as folder:
        ready = Path(folder) / "ready.json"
        proc = switchyard(*args, "--ready-file", str(ready), **popen)
        try:
            report: dict[str, Any] = read_ready_file(ready, proc, timeout)
        except RuntimeError:
            stop(proc)
            raise
    return proc, report


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
    proc, report = started(
        "up", "--http-port", "0", "--log-level", "WARNING", *up_args,
        timeout=120, start_new_session=True,
    )  # fmt: skip
    base = report["base_url"]
    try:
        wait_ready(base, proc)
        yield base
    finally:
        stop(proc)


def callgrind_instructions(argv: Sequence[str], prefix: str) -> int:
    """Instructions callgrind counts for `argv` (a Python child of a benchmark)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        out = Path(tmp) / "callgrind.out"
        full = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv]
        # A fixed hash seed: dict and set layouts, hence instruction counts, repeat exactly.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(full, capture_output=True, text=True, env=env)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise RuntimeError(f"callgrind run failed: {done.stderr[-2000:]}")
        return int(found.group(1))
