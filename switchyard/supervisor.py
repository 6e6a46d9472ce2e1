"""Start child processes, watch them, restart one that crashes, and stop every one of them on
Ctrl-C or SIGTERM, in order: the highest `stop_order` first, each group given its
`stop_grace` to exit before it is killed. Children run in their own process groups, so a
terminal's Ctrl-C reaches the supervisor alone, which then stops them in that order.

A crashed child is restarted with the same command line (an engine comes back on its port, a
router rebinds its endpoint) after a backoff that doubles while it keeps crashing. A child
that crashes `max_restarts` times within `window` seconds is given up on, and the supervisor
reports it so the caller can stop the stack.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

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
    env: dict[str, str] | None = None  # None: the supervisor's own environment
    stop_order: int = 0  # stopped before every child of a lower order
    stop_grace: float = 10.0  # seconds from SIGTERM to SIGKILL
    pass_fds: tuple[int, ...] = ()  # descriptors the child inherits (same numbers)


@dataclass
class _Child:
    spec: ChildSpec
    proc: subprocess.Popen[bytes] | None
    started: float
    crashes: list[float] = field(default_factory=list)
    restart_at: float | None = None


class Supervisor:
    def __init__(
        self,
        restart: bool = True,
        max_restarts: int = 5,
        window: float = 60.0,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
    ) -> None:
        self.restart = restart
        self.max_restarts = max_restarts
        self.window = window
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.children: dict[str, _Child] = {}
        self.restarts = 0

    def start(self, spec: ChildSpec) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            spec.argv,
            preexec_fn=_die_with_parent,
            stdin=subprocess.DEVNULL,
            env=spec.env,
            process_group=0,
            pass_fds=spec.pass_fds,
        )
        child = self.children.get(spec.name)
        if child is None:
            self.children[spec.name] = _Child(spec, proc, time.monotonic())
        else:
            child.proc, child.started, child.restart_at = proc, time.monotonic(), None
        log.info("started %s pid=%d", spec.name, proc.pid)
        return proc

    def respec(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        """Restart `name` with this command line from now on (e.g. with the ports it bound)."""
        child = self.children[name]
        child.spec = dataclasses.replace(child.spec, argv=argv, env=env)

    def pid(self, name: str) -> int | None:
        child = self.children.get(name)
        return child.proc.pid if child is not None and child.proc is not None else None

    def poll(self, now: float | None = None) -> str | None:
        """Reap and restart crashed children. Returns the name of a child given up on (or
        that exited while restarts are off), else None."""
        now = time.monotonic() if now is None else now
        for name, child in self.children.items():
            if child.proc is not None:
                code = child.proc.poll()
                if code is None:
                    continue
                child.proc = None
                if not self.restart:
                    log.error("%s exited with code %d", name, code)
                    return name
                child.crashes = [t for t in child.crashes if now - t < self.window] + [now]
                if len(child.crashes) > self.max_restarts:
                    log.error(
                        "%s exited with code %d, %d times in %.0fs: giving up",
                        name,
                        code,
                        len(child.crashes),
                        self.window,
                    )
                    return name
                delay = min(self.max_backoff, self.backoff * 2 ** (len(child.crashes) - 1))
                child.restart_at = now + delay
                log.warning("%s exited with code %d; restarting in %.1fs", name, code, delay)
            elif child.restart_at is not None and now >= child.restart_at:
                self.restarts += 1
                self.start(child.spec)
        return None

    def next_restart_at(self) -> float | None:
        """When the next restart of a crashed child is due (monotonic), None if none is."""
        due = [c.restart_at for c in self.children.values() if c.restart_at is not None]
        return min(due) if due else None

    def stop_all(self) -> None:
        """Stop every child, group by group: the HTTP edge first, engines last."""
        orders = sorted({c.spec.stop_order for c in self.children.values()}, reverse=True)
        for order in orders:
            group = [
                (name, child.proc, child.spec.stop_grace)
                for name, child in self.children.items()
                if child.proc is not None and child.spec.stop_order == order
            ]
            for _name, proc, _grace in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            start = time.monotonic()
            for name, proc, grace in group:
                try:
                    proc.wait(timeout=max(0.0, start + grace - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop in %.0fs; killing it", name, grace)
                    proc.kill()
                    proc.wait()


class SignalWait:
    """Sleep until a signal arrives (a child exiting: SIGCHLD; Ctrl-C; SIGTERM) or a timeout,
    instead of waking every few hundred milliseconds to look, which an idle stack would pay
    for in CPU. Signals reach it through `signal.set_wakeup_fd`; the handlers already
    installed still run as before."""

    def __init__(self, reader: socket.socket) -> None:
        self._reader = reader

    def wait(self, timeout: float | None) -> bool:
        """True when a signal came, False when the timeout passed first."""
        ready, _, _ = select.select([self._reader], [], [], timeout)
        if not ready:
            return False
        with contextlib.suppress(BlockingIOError):
            while self._reader.recv(512):
                pass
        return True


@contextlib.contextmanager
def signal_wait() -> Iterator[SignalWait]:
    """Install the wake-up (and a SIGCHLD handler, so that exits wake it) for the block."""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous_chld = signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    try:
        yield SignalWait(reader)
    finally:
        signal.signal(signal.SIGCHLD, previous_chld)
        signal.set_wakeup_fd(previous_fd)
        reader.close()
        writer.close()
