"""Ports for services started on one host (`switchyard up`, tests, benchmarks), without races.

A port picked as free by one process and bound later by another can be taken in between
(CI once lost a run that way). So every service binds its own sockets: port 0 in a flag
(`--port 0`, `--bind tcp://127.0.0.1:0`, `--metrics-port 0`) means "search `--port-range`
and bind the first free port found", and the service reports what it bound in its
`--ready-file` (JSON, written atomically once every socket is bound). The parent reads the
file; nobody else ever holds the number before the service does.

The default range lies below the kernel's ephemeral range, where every outgoing connection
(ZMQ reconnects, gRPC channels, HTTP clients) gets its local port: a port there is not taken
by a client between a crash and the restart that binds it again.

`free_port` (pick now, bind later) is left for in-process use only: a test that binds the
port itself right away.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # below: well-known and registered services are more common
_TRIES = 64
_SEARCH_TRIES = 256
_rng = random.Random()

T = TypeVar("T")


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


@dataclass(frozen=True)
class PortRange:
    low: int
    high: int  # inclusive

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high <= 65535:
            raise ValueError(f"bad port range {self.low}-{self.high}")

    @classmethod
    def parse(cls, text: str) -> PortRange:
        """`LO-HI` (inclusive)."""
        low, sep, high = text.partition("-")
        try:
            if not sep:
                raise ValueError
            return cls(int(low), int(high))
        except ValueError:
            raise ValueError(f"expected LO-HI (e.g. 20000-20999), got {text!r}") from None

    @classmethod
    def default(cls) -> PortRange:
        """Below the ephemeral range (or the ephemeral range itself if that leaves too few)."""
        top = _ephemeral_start() - 1
        if top - _LOWEST >= 1000:
            return cls(_LOWEST, top)
        return cls(32_768, 60_999)

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"

    def candidates(self) -> list[int]:
        """Ports to try, in random order (a bounded sample of a large range)."""
        size = self.high - self.low + 1
        if size <= _SEARCH_TRIES:
            ports = list(range(self.low, self.high + 1))
            _rng.shuffle(ports)
            return ports
        return _rng.sample(range(self.low, self.high + 1), _SEARCH_TRIES)


# errnos of a bind that another port may not hit (any other errno, or a socket.gaierror, is
# about the address, not the port); an OSError without one is taken as "try another port".
_PORT_TAKEN = frozenset({errno.EADDRINUSE, errno.EACCES})


def bind_in_range(bind: Callable[[int], T], ports: PortRange | None = None) -> T:
    """Call `bind(port)` for free-looking ports of the range until one does not raise
    OSError; returns its result. OSError when every try failed. An error that says the
    address itself is wrong (an unknown host, one not on this machine: an errno other than
    in-use / denied) is raised at once: another port cannot fix it, and each try of a host
    name that does not resolve is a DNS lookup (the search took 25 s, then said "no free
    port")."""
    ports = ports or PortRange.default()
    last: OSError | None = None
    for port in ports.candidates():
        try:
            return bind(port)
        except OSError as exc:
            if exc.errno is not None and exc.errno not in _PORT_TAKEN:
                raise
            last = exc
    raise OSError(f"no free port in {ports}: {last}")


def bind_tcp(
    host: str, port: int, ports: PortRange | None = None, *, reuse_port: bool = False
) -> socket.socket:
    """A TCP socket bound (not listening) to host:port, or to a free port of the range when
    `port` is 0."""

    def attempt(candidate: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                if port == 0 and not _exclusive(family, host, candidate):
                    raise OSError(f"port {candidate} is in use")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, candidate))
        except BaseException:
            sock.close()
            raise
        return sock

    return attempt(port) if port else bind_in_range(attempt, ports)


def _exclusive(family: int, host: str, port: int) -> bool:
    """Nobody holds host:port at all. A search that binds with SO_REUSEPORT checks this
    first: that bind alone would also succeed next to another process's SO_REUSEPORT
    sockets (same user), silently sharing their port."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def tcp_endpoint_port(endpoint: str) -> tuple[str, int] | None:
    """(host, port) of `tcp://host:port`, or None for another transport or a `*` port."""
    if not endpoint.startswith("tcp://"):
        return None
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host, int(port)


def wildcard_endpoint(endpoint: str) -> str:
    """`tcp://host:port` as `tcp://*:port` (other endpoints unchanged): how a KV-event
    publisher is told to bind a port it bound before, since the engines' rule makes a
    publisher whose endpoint names a host connect to it instead."""
    parsed = tcp_endpoint_port(endpoint)
    return f"tcp://*:{parsed[1]}" if parsed is not None else endpoint


def zmq_bind(sock: Any, endpoint: str, ports: PortRange | None = None) -> str:
    """Bind a ZMQ socket; `tcp://host:0` searches the range. Returns the bound endpoint."""
    import zmq

    parsed = tcp_endpoint_port(endpoint)
    if parsed is None or parsed[1] != 0:
        sock.bind(endpoint)
    else:
        host = parsed[0]

        def attempt(port: int) -> None:
            try:
                sock.bind(f"tcp://{host}:{port}")
            except zmq.ZMQError as exc:
                raise OSError(exc.errno, str(exc)) from None

        bind_in_range(attempt, ports)
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else str(last)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody has bound on `host` right now, outside the ephemeral range. For a
    process that binds it itself at once; never hand it to a child process to bind."""
    top = _ephemeral_start() - 1
    if top - _LOWEST >= 1000:
        for _ in range(_TRIES):
            port = _rng.randint(_LOWEST, top)
            if _exclusive(socket.AF_INET, host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# ---- the ready file: how a service tells its parent what it bound ---------------------------


def add_port_arguments(
    parser: argparse.ArgumentParser, ready_when: str = "once every socket is bound"
) -> None:
    parser.add_argument(
        "--port-range",
        type=_port_range_arg,
        default=None,
        metavar="LO-HI",
        help="where a port given as 0 is searched (default: below the ephemeral range)",
    )
    parser.add_argument(
        "--ready-file",
        type=Path,
        default=None,
        help=f"write the bound ports here (JSON) {ready_when}",
    )


def port_number(text: str) -> int:
    """argparse type of a TCP port flag: 0..65535 (0: a free one), refused at parse time
    instead of a bind() traceback after the stack started."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range (0-65535): {value}")
    return value


def _port_range_arg(text: str) -> PortRange:
    try:
        return PortRange.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def write_ready_file(path: Path | None, report: dict[str, Any]) -> None:
    """Atomically (write + rename): a reader sees the whole report or none."""
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report))
    tmp.replace(path)


def read_ready_file(
    path: Path, proc: subprocess.Popen[Any] | None = None, timeout: float = 60.0
) -> dict[str, Any]:
    """Wait for a child's ready file. RuntimeError when the child exits first or the file
    does not come within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            report: dict[str, Any] = json.loads(path.read_text())
            return report
        except FileNotFoundError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready after {timeout:g}s (no {path})")
        time.sleep(0.02)
