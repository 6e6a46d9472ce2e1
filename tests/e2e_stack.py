"""Start a real local stack (`switchyard up` in a child process) for end-to-end tests.

Every port is free-picked, readiness is polled with a deadline, and teardown stops the whole
process tree and checks that nothing was left running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from switchyard.common.ports import free_port


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.split("\n"):
        parts = line.split()
        if len(parts) == 2:
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class Stack:
    base_url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def engine_urls(self) -> list[str]:
        """The engines `switchyard up` announced when it became ready."""
        for line in self.log().splitlines():
            if "is serving the OpenAI API" in line and "(engines: " in line:
                return line.split("(engines: ", 1)[1].rstrip(")").split(", ")
        raise AssertionError("the stack never announced its engines")


@contextlib.contextmanager
def running_stack(*up_args: str, ready: bool = True, timeout: float = 60.0) -> Iterator[Stack]:
    port = free_port()
    log_file = tempfile.NamedTemporaryFile(prefix="switchyard-up-", suffix=".log", delete=False)
    argv = [
        sys.executable,
        "-m",
        "switchyard",
        "up",
        "--http-port",
        str(port),
        "--mock-speedup",
        "4",
        *up_args,
    ]
    proc = subprocess.Popen(
        argv,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    stack = Stack(f"http://127.0.0.1:{port}", proc, Path(log_file.name))
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"switchyard up exited early:\n{stack.log()[-4000:]}")
            if ready:
                # `up` announces readiness (and its engines) once /ready answers 200.
                if "is serving the OpenAI API" in stack.log():
                    break
            elif http_status(stack.base_url + "/health") is not None:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"stack not ready in {timeout}s:\n{stack.log()[-4000:]}")
            time.sleep(0.2)
        yield stack
    finally:
        tree = _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        leftovers = [pid for pid in tree if _alive(pid)]
        for pid in leftovers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        log_file.close()
        assert not leftovers, f"processes left running after the stack stopped: {leftovers}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie is dead for our purposes.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return False
    return True


class Processes:
    """Switchyard services started one by one (for tests that kill and restart some of them).
    Every process is stopped at exit, also on failure."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = Path(tempfile.mkstemp(prefix=f"switchyard-{name}-", suffix=".log")[1])
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "switchyard", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.procs[name], self.logs[name] = proc, log
        return proc

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError(f"{name} did not stop on SIGTERM") from None


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """Poll `predicate` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
