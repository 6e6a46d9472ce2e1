"""The preprocessor's HTTP listening socket: the one seam between the process and its
clients' connections (TLS, when configured, wraps what uvicorn accepts from it).

Two ways to get it:
- inherited (`--listen-fd FD`): a parent (`switchyard up`) binds the API port once per
  replica, as one SO_REUSEPORT group (`listen_group`: the kernel spreads new connections
  evenly over the sockets), listens on every socket and holds them all for the stack's
  lifetime. Each replica accepts from its own once it is ready (the lifespan waits; a lone
  replica at once), and watches its siblings' (`--standby-fd`, standby.py) for connections
  they leave waiting. A
  replica that dies loses only the connections it had accepted: its socket and queue live on
  in the parent, the siblings take what waits there, and its restart inherits it again.
- its own (`--host`/`--port`, port 0 searched in `--port-range`), optionally with
  SO_REUSEPORT (`--reuse-port`) for processes without a common parent. Each such process has
  its own accept queue, closed with it: connections the kernel had queued for a process that
  dies are reset, unless the host sets net.ipv4.tcp_migrate_req=1 (docs/operating.md).
"""

from __future__ import annotations

import socket

from switchyard.common.ports import PortRange, bind_tcp

BACKLOG = 2048  # uvicorn's default; the kernel caps it at net.core.somaxconn


def adopt(fd: int) -> socket.socket:
    """The listening TCP socket inherited as descriptor `fd`. ValueError when `fd` is not
    one (closed, not a socket, not TCP, not listening): a parent's wiring mistake must not
    turn into a server that never accepts."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ValueError(f"--listen-fd {fd}: not an open socket ({exc.strerror})") from None
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (
            socket.AF_INET,
            socket.AF_INET6,
        ):
            raise ValueError(f"--listen-fd {fd}: not a TCP socket")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ValueError(f"--listen-fd {fd}: the socket is not listening")
    except BaseException:
        sock.detach()  # the descriptor is the parent's to close
        raise
    return sock


def open_listener(
    host: str,
    port: int,
    ports: PortRange | None = None,
    *,
    reuse_port: bool = False,
    listen_fd: int | None = None,
) -> socket.socket:
    """The socket to serve HTTP on: the inherited one, else one bound here (not listening
    yet: uvicorn listens once the app started). OSError when the bind fails, ValueError for a
    bad `listen_fd`."""
    if listen_fd is not None:
        return adopt(listen_fd)
    return bind_tcp(host, port, ports, reuse_port=reuse_port)


def listen_group(
    host: str, port: int, count: int, ports: PortRange | None = None
) -> list[socket.socket]:
    """`count` sockets of one SO_REUSEPORT group on host:port (0: a free one of `ports`),
    listening and inheritable, for a parent to hand to the replicas it starts."""
    if port:
        # Nobody may hold it yet: bound with SO_REUSEPORT, the group would silently share
        # the port with another process of this user (a second `make run`). A port 0 search
        # checks this itself.
        bind_tcp(host, port).close()
    group: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = bind_tcp(host, port, ports, reuse_port=True)
            group.append(sock)
            port = int(sock.getsockname()[1])
            sock.listen(BACKLOG)
            sock.set_inheritable(True)
    except BaseException:
        for sock in group:
            sock.close()
        raise
    return group
