"""Where the HTTP listening socket comes from: an inherited one (checked), a group of
SO_REUSEPORT sockets for a parent to hand out, or one bound here."""

from __future__ import annotations

import os
import socket

import pytest

from switchyard.preprocessor.listener import adopt, listen_group, open_listener


def listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


class TestAdopt:
    def test_a_listening_tcp_socket_is_served_as_is(self):
        parent = listening()
        fd = os.dup(parent.fileno())
        sock = adopt(fd)
        try:
            assert sock.fileno() == fd
            assert sock.getsockname() == parent.getsockname()
        finally:
            sock.close()
            parent.close()

    @pytest.mark.parametrize(
        ("make", "problem"),
        [
            (lambda: socket.socket(), "not listening"),
            (lambda: socket.socket(type=socket.SOCK_DGRAM), "not a TCP socket"),
            (lambda: socket.socket(socket.AF_UNIX), "not a TCP socket"),
        ],
    )
    def test_anything_else_is_refused_and_left_open(self, make, problem):
        original = make()
        try:
            with pytest.raises(ValueError, match=problem):
                adopt(original.fileno())
            os.fstat(original.fileno())  # the descriptor is still the caller's
        finally:
            original.close()

    def test_a_closed_descriptor_is_refused(self):
        fd = os.open(os.devnull, os.O_RDONLY)
        os.close(fd)
        with pytest.raises(ValueError, match="not an open socket"):
            adopt(fd)

    def test_a_file_is_refused(self):
        fd = os.open(os.devnull, os.O_RDONLY)
        try:
            with pytest.raises(ValueError, match="not an open socket"):
                adopt(fd)
        finally:
            os.close(fd)


class TestListenGroup:
    def test_one_port_every_socket_listening_and_inheritable(self):
        group = listen_group("127.0.0.1", 0, 3)
        try:
            assert len({s.getsockname() for s in group}) == 1
            for sock in group:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
                assert sock.get_inheritable()
        finally:
            for sock in group:
                sock.close()

    def test_a_port_someone_holds_is_refused_not_shared(self):
        """A second stack on the same explicit port fails to bind (EADDRINUSE), rather than
        joining the first one's SO_REUSEPORT group and taking half its connections."""
        first = listen_group("127.0.0.1", 0, 2)
        try:
            port = first[0].getsockname()[1]
            with pytest.raises(OSError):
                listen_group("127.0.0.1", port, 2)
        finally:
            for sock in first:
                sock.close()
        again = listen_group("127.0.0.1", port, 1)  # free again: fine
        again[0].close()

    def test_connections_reach_every_socket_of_the_group(self):
        """The kernel spreads connections over the group (by their 4-tuple hash)."""
        group = listen_group("127.0.0.1", 0, 2)
        clients = []
        try:
            for _ in range(64):
                clients.append(socket.create_connection(group[0].getsockname()))
            reached = []
            for sock in group:
                sock.setblocking(False)
                count = 0
                while True:
                    try:
                        conn, _ = sock.accept()
                    except BlockingIOError:
                        break
                    conn.close()
                    count += 1
                reached.append(count)
            assert sum(reached) == 64
            assert all(reached), reached  # all 64 on one socket: about 1 in 10^19
        finally:
            for sock in [*clients, *group]:
                sock.close()


def test_open_listener_binds_when_nothing_is_inherited():
    sock = open_listener("127.0.0.1", 0)
    try:
        assert sock.getsockname()[1] > 0
        assert not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)  # uvicorn listens
    finally:
        sock.close()
