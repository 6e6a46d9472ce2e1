"""Temporary folders that do not outlive their process, not even a killed one.

Every temporary folder a service makes goes under one folder of its own process,
`<tmp>/switchyard-proc-<pid>-<start time>`, removed when the interpreter exits (`folder()`:
when its block ends). A process that was killed (SIGKILL, OOM) cannot remove it: the next
process that asks for a scratch folder sweeps every `switchyard-proc-*` folder whose process is
gone. The start time (from /proc/<pid>/stat) tells a live owner from a new process that got
the same pid.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "switchyard-proc-"

_lock = threading.Lock()
_mine: Path | None = None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot; "" where /proc is missing;
    None when no such process runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if not Path("/proc/self/stat").exists():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            except PermissionError:
                pass
            return ""
        return None
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(name: str) -> bool:
    pid_text, _, started = name.removeprefix(PREFIX).partition("-")
    try:
        pid = int(pid_text)
    except ValueError:
        return True  # not one of ours: leave it
    now = _start_time(pid)
    return now is not None and (now == "" or now == started)


def sweep(root: Path) -> list[Path]:
    """Remove the process folders under `root` whose process is gone; returns them."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            if entry.name.startswith(PREFIX) and entry.is_dir() and not _owner_alive(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def process_dir(root: Path | None = None) -> Path:
    """This process's folder (made, and leftovers swept, on first use; removed at exit)."""
    global _mine
    with _lock:
        if _mine is not None and _mine.is_dir():
            return _mine
        root = root or Path(tempfile.gettempdir())
        for gone in sweep(root):
            log.info("removed %s, left by a process that is gone", gone)
        pid = os.getpid()
        mine = root / f"{PREFIX}{pid}-{_start_time(pid) or ''}"
        mine.mkdir(mode=0o700, exist_ok=True)
        if _mine is None:
            atexit.register(_remove)
        _mine = mine
        return mine


def mkdtemp(prefix: str) -> str:
    """tempfile.mkdtemp inside this process's folder."""
    return tempfile.mkdtemp(prefix=prefix, dir=process_dir())


@contextlib.contextmanager
def folder(prefix: str) -> Iterator[Path]:
    """A temporary folder in this process's folder, removed when the block ends (and the
    process's folder with it when nothing else is left in it). The way to use it where the
    process may end by a signal: uvicorn re-raises SIGTERM after its shutdown, so a server's
    interpreter never runs its exit handlers."""
    made = Path(mkdtemp(prefix))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)
        with contextlib.suppress(OSError):
            made.parent.rmdir()  # only when empty


def _remove() -> None:
    if _mine is not None:
        shutil.rmtree(_mine, ignore_errors=True)
