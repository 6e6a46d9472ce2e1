"""Free TCP ports for services started on one host (`switchyard up`, tests, benchmarks).

A port from bind(("", 0)) comes from the kernel's ephemeral range, which is also where every
outgoing connection (ZMQ reconnects, gRPC channels, HTTP clients) gets its local port. Between
picking such a port and the child process binding it, a connection may take it: a rare
start-up failure (seen once in a while in the end-to-end tests). Ports are therefore picked
at random below the ephemeral range and checked by binding them; only when that range is too
small does it fall back to the kernel's choice.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # below: well-known and registered services are more common
_TRIES = 64
_rng = random.Random()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody has bound on `host` right now, outside the ephemeral range."""
    top = _ephemeral_start() - 1
    if top - _LOWEST >= 1000:
        for _ in range(_TRIES):
            port = _rng.randint(_LOWEST, top)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
