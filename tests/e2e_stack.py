"""Start a real local stack (`switchyard up` in a child process) for end-to-end tests.

Every process binds its own ports (port 0) and reports them in a ready file, so no port is
picked by the test and bound by a child; readiness is polled with a deadline, and teardown
stops the whole process tree and checks that nothing was left running.

The processes' logs (switchyard-NAME-*.log in the temp folder) are removed once the tests
that saw them passed, and stay when one failed: its report names them (LOGS, settled by
tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
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
from typing import Any

import httpx

from switchyard.common.ports import read_ready_file

LOCAL = "tcp://127.0.0.1:0"  # a free loopback port, searched by the process that binds it


class LogFiles:
    """The log files of the stacks and processes started here. Under pytest, the logs of a
    stack that stopped during a test are removed when that test ends, unless a test failed
    while they were written (or as they stopped): those stay, and the failed test's report
    lists them. Outside pytest nothing removes them."""

    def __init__(self) -> None:
        self.writing: list[Path] = []  # of a stack or process still running
        self.stopped: list[Path] = []  # stopped since the last test ended
        self.kept: set[Path] = set()

    def started(self, path: Path) -> None:
        self.writing.append(path)

    def stop(self, paths: list[Path]) -> None:
        for path in paths:
            if path in self.writing:
                self.writing.remove(path)
                self.stopped.append(path)

    def failed(self) -> list[Path]:
        """A test failed: the logs it saw stay. Returns them."""
        seen = [*self.writing, *self.stopped]
        self.kept.update(seen)
        return seen

    def test_ended(self) -> None:
        """Remove the logs stopped during the test that ended, but those kept."""
        for path in self.stopped:
            if path not in self.kept:
                path.unlink(missing_ok=True)
        self.stopped.clear()


LOGS = LogFiles()


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
    ready_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def report(self) -> dict[str, Any]:
        """`up`'s ready file: children's ports and pids (rewritten after a restart)."""
        report: dict[str, Any] = json.loads(self.ready_path.read_text())
        return report

    def pid(self, child: str) -> int:
        return int(self.report()["pids"][child])

    def engine_urls(self) -> list[str]:
        """The engines `switchyard up` announced when it became ready."""
        for line in messages(self.log()):
            if "is serving the OpenAI API" in line and "(engines: " in line:
                return line.split("(engines: ", 1)[1].rstrip(")").split(", ")
        raise AssertionError("the stack never announced its engines")


@contextlib.contextmanager
def running_stack(*up_args: str, ready: bool = True, timeout: float = 60.0) -> Iterator[Stack]:
    log_file = tempfile.NamedTemporaryFile(prefix="switchyard-up-", suffix=".log", delete=False)
    ready_path = Path(log_file.name).with_suffix(".json")
    argv = [
        sys.executable,
        "-m",
        "switchyard",
        "up",
        "--http-port",
        "0",
        "--ready-file",
        str(ready_path),
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
    stack = Stack("", proc, Path(log_file.name), ready_path)
    LOGS.started(stack.log_path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"switchyard up exited early:\n{stack.log()[-4000:]}")
            if not stack.base_url:
                stack.base_url = _announced_base(stack.log())
            if ready:
                # `up` announces readiness (and its engines) once /ready answers 200, and
                # writes its ready file.
                if "is serving the OpenAI API" in stack.log() and ready_path.exists():
                    break
            elif stack.base_url and http_status(stack.base_url + "/health") is not None:
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
        ready_path.unlink(missing_ok=True)
        LOGS.stop([stack.log_path])
        assert not leftovers, f"processes left running after the stack stopped: {leftovers}"


def messages(log: str) -> Iterator[str]:
    """The log's lines, the message alone of a JSON line (`--log-format json`)."""
    for line in log.splitlines():
        if line.startswith("{"):
            try:
                yield str(json.loads(line).get("msg", ""))
                continue
            except ValueError:
                pass
        yield line


def _announced_base(log: str) -> str:
    """The HTTP base URL `up` logs once it holds the HTTP port."""
    marker = "the API will be on "
    for line in messages(log):
        if marker in line:
            return line.split(marker, 1)[1].split()[0].removesuffix("/v1")
    return ""


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


@dataclass
class Ready:
    procs: Processes
    name: str
    proc: subprocess.Popen[bytes]
    path: Path
    timeout: float

    def result(self) -> dict[str, Any]:
        try:
            return read_ready_file(self.path, self.proc, self.timeout)
        except RuntimeError as exc:
            log = self.procs.log(self.name)[-3000:]
            raise AssertionError(f"{self.name} {exc}:\n{log}") from None
        finally:
            self.path.unlink(missing_ok=True)


class Processes:
    """Switchyard services started one by one (for tests that kill and restart some of them).
    Every process is stopped at exit, also on failure."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}  # each name's latest
        self.every_log: list[Path] = []  # restarts' too

    def start(
        self, name: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """`env`: variables added to this process's environment for the child."""
        log = Path(tempfile.mkstemp(prefix=f"switchyard-{name}-", suffix=".log")[1])
        self.every_log.append(log)
        LOGS.started(log)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "switchyard", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env} if env else None,
            )
        self.procs[name], self.logs[name] = proc, log
        return proc

    def serve(
        self, name: str, *args: str, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Start a service with `--ready-file` and return what it reports it bound."""
        return self.start_ready(name, *args, timeout=timeout, env=env).result()

    def start_ready(
        self, name: str, *args: str, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> Ready:
        """Like `serve`, without waiting: `.result()` waits for the report."""
        ready = Path(tempfile.mkstemp(prefix=f"switchyard-{name}-", suffix=".json")[1])
        ready.unlink()
        proc = self.start(name, *args, "--ready-file", str(ready), env=env)
        return Ready(self, name, proc, ready, timeout)

    def signal(self, name: str, signum: int) -> None:
        self.procs[name].send_signal(signum)

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
                proc.send_signal(signal.SIGCONT)  # a frozen one must be able to stop
                proc.send_signal(signal.SIGTERM)
        stuck = []
        for name, proc in self.procs.items():  # every one is waited for, also after a stuck one
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                stuck.append(name)
        LOGS.stop(self.every_log)
        if stuck:
            raise AssertionError(f"{', '.join(stuck)} did not stop on SIGTERM")


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """Poll `predicate` until it returns a truthy value; fail after `timeout` seconds.

    A connection refused or reset counts as "not yet": a service's ready file reports its
    bound ports, and its listener accepts only once its start-up is over."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value, error = predicate(), None
        except (httpx.TransportError, ConnectionError) as exc:
            value, error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f" (last: {error!r})" if error is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)
