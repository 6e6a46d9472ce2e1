"""Several loopback addresses standing for the replicas behind one name (Linux routes all of
127.0.0.0/8 to `lo`, so 127.0.0.2, 127.0.0.3, ... need no setup): a port free on each."""

from __future__ import annotations

import socket

from switchyard.common.ports import free_port

REPLICA_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def _free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def common_free_port(hosts: tuple[str, ...] = REPLICA_HOSTS) -> int:
    """A TCP port nobody holds on any of `hosts` right now (the replicas of one name share
    their port); for this process or its children to bind at once."""
    for _ in range(100):
        port = free_port(hosts[0])
        if all(_free(host, port) for host in hosts[1:]):
            return port
    raise RuntimeError(f"no port is free on all of {', '.join(hosts)}")
