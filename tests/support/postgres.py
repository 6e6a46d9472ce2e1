"""A throwaway PostgreSQL server for tests and benchmarks: Debian's server binaries, a
cluster in a temporary folder, listening on a unix socket in that folder only (no TCP port
to pick), stopped and removed at the end, also on failure.

initdb refuses to run as root: as root the server runs as the `postgres` system user (the
one Debian's package creates), else `nobody`, in a folder that user owns. Without the
binaries, `PostgresMissing` says how to install them (`apt-get install -y postgresql`;
`.ci/run` does it on a fresh machine).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = (
    "PostgreSQL's server binaries (initdb, pg_ctl) are not installed; the stored-responses "
    "tests run a real server: `sudo apt-get install -y postgresql` (Debian/Ubuntu), or "
    "`make postgres`"
)
PORT = 5432  # only names the socket file (.s.PGSQL.5432) inside the private folder
USER = "switchyard"
FAST = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")


class PostgresMissing(RuntimeError):
    pass


def server_binaries() -> Path:
    """The folder holding initdb and pg_ctl (PATH first, then Debian's versioned folders)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if versions:
        return Path(versions[-1]).parent
    raise PostgresMissing(INSTALL_HINT)


@dataclass
class PostgresServer:
    folder: Path
    bin: Path
    user: str | None  # the system user the server runs as (None: this process's)
    pid: int = 0

    @property
    def socket_dir(self) -> Path:
        return self.folder / "run"

    @property
    def dsn(self) -> str:
        return f"postgresql://{USER}@/postgres?host={self.socket_dir}&port={PORT}"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            user=self.user,
            cwd=self.folder,
            capture_output=True,
            text=True,
            check=check,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )

    def start(self, settings: tuple[str, ...] = FAST) -> None:
        options = [f"-p {PORT}", f"-k {self.socket_dir}", "-c listen_addresses=''"]
        options += [f"-c {s}" for s in settings]
        try:
            self._run(
                str(self.bin / "pg_ctl"),
                "-D", str(self.folder / "data"),
                "-l", str(self.folder / "server.log"),
                "-o", " ".join(options),
                "-w", "-t", "60",
                "start",
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"PostgreSQL did not start: {exc.stderr}\n{self.log()}") from None
        self.pid = int((self.folder / "data" / "postmaster.pid").read_text().split()[0])

    def stop(self, mode: str = "fast") -> None:
        if not self.pid:
            return
        result = self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.folder / "data"), "-m", mode, "-w", "stop",
            check=False,
        )  # fmt: skip
        if result.returncode != 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.pid = 0

    def pause(self) -> None:
        """Freeze the server and its backends (SIGSTOP): a database that stops answering."""
        for pid in self._pids():
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self._pids():
            os.kill(pid, signal.SIGCONT)

    def _pids(self) -> list[int]:
        out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
        pids = [self.pid]
        for line in out.stdout.splitlines():
            pid, ppid = (int(x) for x in line.split())
            if ppid == self.pid:
                pids.append(pid)
        return pids

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _server_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PostgresMissing("running as root and no unprivileged user to run PostgreSQL as")


@contextlib.contextmanager
def throwaway_postgres(settings: tuple[str, ...] = FAST) -> Iterator[PostgresServer]:
    """A fresh cluster, started; stopped and deleted on exit. `settings`: server options
    (the default trades durability for speed: a test's data need not survive a crash)."""
    bin_dir = server_binaries()
    user = _server_user()
    folder = Path(tempfile.mkdtemp(prefix="switchyard-pg-"))
    server = PostgresServer(folder, bin_dir, user)
    try:
        (folder / "run").mkdir()
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (folder, folder / "run"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        try:
            server._run(
                str(bin_dir / "initdb"), "-D", str(folder / "data"), "-U", USER,
                "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions",
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"initdb failed: {exc.stderr}") from None
        server.start(settings)
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.resume()
        server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)
