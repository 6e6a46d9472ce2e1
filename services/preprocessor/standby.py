"""Standby accept: take the connections a sibling replica leaves waiting in its queue.

`switchyard up` gives each preprocessor replica its own listening socket of one SO_REUSEPORT
group (the kernel spreads new connections evenly over them) and every replica the others'
sockets too, as standbys. A replica watches its siblings' sockets: when one has a connection
pending, it waits `grace`; if the connection is still there (the sibling is dead, restarting,
frozen or too busy to accept), it accepts it and serves it as its own. A healthy sibling
accepts in well under the grace, so standbys take nothing from it.

This is what Linux's net.ipv4.tcp_migrate_req does for a closed SO_REUSEPORT listener, done
here without the sysctl (which needs privileges in each network namespace) and for a frozen
replica as well, whose queue the kernel would leave waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

GRACE_S = 0.05  # a pending connection older than this is taken over
RETRY_S = 1.0  # after an accept error (out of descriptors), look again this much later

Serve = Callable[[socket.socket], None]  # hands an accepted connection to the HTTP server


class Standby:
    """Watches `sockets` (listening, owned by sibling replicas) on the running loop; each
    connection found waiting past `grace` is accepted and passed to `serve`."""

    def __init__(
        self,
        sockets: Sequence[socket.socket],
        serve: Serve,
        grace: float = GRACE_S,
        on_taken: Callable[[], None] | None = None,
    ) -> None:
        self._sockets = list(sockets)
        self._serve = serve
        self._grace = grace
        self._on_taken = on_taken
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self.taken = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for sock in self._sockets:
            sock.setblocking(False)
            self._watch(sock)

    def close(self) -> None:
        """Stop watching (the sockets stay open: the siblings' and the parent's to close)."""
        if self._loop is None:
            return
        for sock in self._sockets:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._loop = None

    def _watch(self, sock: socket.socket) -> None:
        assert self._loop is not None
        self._loop.add_reader(sock.fileno(), self._pending, sock)

    def _pending(self, sock: socket.socket) -> None:
        """A connection is pending: give its owner the grace before looking again."""
        assert self._loop is not None
        self._loop.remove_reader(sock.fileno())
        self._timers[sock.fileno()] = self._loop.call_later(self._grace, self._take, sock)

    def _take(self, sock: socket.socket) -> None:
        """Accept every connection still waiting, then watch again."""
        self._timers.pop(sock.fileno(), None)
        if self._loop is None:
            return
        while True:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # EMFILE and kin: the connection stays queued
                log.warning("standby accept failed: %s; retrying in %gs", exc, RETRY_S)
                self._timers[sock.fileno()] = self._loop.call_later(RETRY_S, self._take, sock)
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.taken += 1
            if self._on_taken is not None:
                self._on_taken()
            try:
                self._serve(conn)
            except Exception:
                log.exception("serving a connection taken over failed")
                conn.close()
        self._watch(sock)
