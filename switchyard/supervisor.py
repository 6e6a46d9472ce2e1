"""Start child processes, watch them, and stop every one of them: on Ctrl-C, on SIGTERM, or
as soon as one of them exits on its own."""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Children get SIGTERM if the supervisor itself is killed (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: list[str]


class Supervisor:
    def __init__(self) -> None:
        self.children: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, spec: ChildSpec) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(spec.argv, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)
        self.children[spec.name] = proc
        log.info("started %s pid=%d", spec.name, proc.pid)
        return proc

    def first_exited(self) -> tuple[str, int] | None:
        for name, proc in self.children.items():
            code = proc.poll()
            if code is not None:
                return name, code
        return None

    def stop_all(self, grace: float = 10.0) -> None:
        # Stop in reverse start order: the HTTP edge first, engines last.
        procs = list(self.children.items())[::-1]
        for _name, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0fs; killing it", name, grace)
                proc.kill()
                proc.wait()
