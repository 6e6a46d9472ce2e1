import errno
import socket
import subprocess
import sys

import pytest
import zmq

from switchyard.common import ports
from switchyard.common.ports import free_port


def test_a_free_port_can_be_bound_and_is_below_the_ephemeral_range():
    start = ports._ephemeral_start()
    for _ in range(20):
        port = free_port()
        if start - 1 - ports._LOWEST >= 1000:
            assert ports._LOWEST <= port < start
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_bound_port_is_not_handed_out(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        draws = iter([busy, busy])
        monkeypatch.setattr(ports._rng, "randint", lambda a, b: next(draws, 0) or a + 7)
        port = free_port()
        assert port != busy


class TestPortRange:
    def test_parse(self):
        assert ports.PortRange.parse("20000-20009") == ports.PortRange(20000, 20009)
        for bad in ("20000", "b-a", "9-1", "0-5", "1-70000"):
            with pytest.raises(ValueError):
                ports.PortRange.parse(bad)

    def test_default_is_below_the_ephemeral_range(self):
        default = ports.PortRange.default()
        if ports._ephemeral_start() - 1 - ports._LOWEST >= 1000:
            assert default.high < ports._ephemeral_start()


class TestBindingOwnPorts:
    """Issue 14: a port picked as free by one process and bound later by another can be
    taken in between (CI lost a run so). A process searches and binds its own."""

    def test_the_search_skips_taken_ports_and_keeps_the_socket(self):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            low = taken.getsockname()[1]
            # A two-port range whose first port is taken: the search lands on the other.
            if low == 65535:
                pytest.skip("no room above the taken port")
            span = ports.PortRange(low, low + 1)
            for _ in range(5):
                try:
                    sock = ports.bind_tcp("127.0.0.1", 0, span)
                except OSError:
                    pytest.skip("the neighbour port is in use too")
                with sock:
                    assert sock.getsockname()[1] == low + 1

    def test_no_free_port_is_an_error(self):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            port = taken.getsockname()[1]
            with pytest.raises(OSError, match="no free port"):
                ports.bind_tcp("127.0.0.1", 0, ports.PortRange(port, port))

    def test_a_reuse_port_search_does_not_join_another_processs_port(self):
        """SO_REUSEPORT alone would bind next to a foreign SO_REUSEPORT socket."""
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            other.bind(("127.0.0.1", 0))
            port = other.getsockname()[1]
            with pytest.raises(OSError):
                ports.bind_tcp("127.0.0.1", 0, ports.PortRange(port, port), reuse_port=True)
            # An explicit port shares it, as the preprocessors of one `up` do.
            with ports.bind_tcp("127.0.0.1", port, reuse_port=True) as shared:
                assert shared.getsockname()[1] == port

    def test_zmq_port_zero_binds_in_the_range(self):
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        try:
            span = ports.PortRange.default()
            endpoint = ports.zmq_bind(sock, "tcp://127.0.0.1:0", span)
            port = int(endpoint.rsplit(":", 1)[1])
            assert span.low <= port <= span.high
        finally:
            sock.close(linger=0)
            ctx.term()

    def test_wildcard_endpoint_keeps_the_port(self):
        assert ports.wildcard_endpoint("tcp://127.0.0.1:5557") == "tcp://*:5557"
        assert ports.wildcard_endpoint("tcp://[::1]:5557") == "tcp://*:5557"
        assert ports.wildcard_endpoint("ipc:///tmp/kv") == "ipc:///tmp/kv"

    def test_ready_file_round_trip(self, tmp_path):
        path = tmp_path / "ready.json"
        with pytest.raises(RuntimeError, match="not ready"):
            ports.read_ready_file(path, None, timeout=0.1)
        ports.write_ready_file(path, {"port": 123})
        assert ports.read_ready_file(path, None, timeout=1) == {"port": 123}
        assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]  # no temp file left

    def test_a_child_that_exits_before_it_is_ready_is_reported(self, tmp_path):
        proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        proc.wait()
        with pytest.raises(RuntimeError, match="exited with code 3"):
            ports.read_ready_file(tmp_path / "never.json", proc, timeout=10)


def test_a_bad_host_is_raised_at_once_not_searched_port_by_port():
    """An unknown host or one not on this machine is not a taken port: the search stops at
    the first try with that error (it retried every candidate, a DNS lookup each, then
    said "no free port")."""
    tries: list[int] = []

    def bind(port: int) -> int:
        tries.append(port)
        raise socket.gaierror(-2, "Name or service not known")

    with pytest.raises(socket.gaierror):
        ports.bind_in_range(bind)
    assert len(tries) == 1
    with pytest.raises(OSError, match="Cannot assign"):
        ports.bind_tcp("192.0.2.1", 0)  # TEST-NET-1: not an address of this host


def test_a_taken_port_is_still_searched_past():
    tries: list[int] = []

    def bind(port: int) -> int:
        tries.append(port)
        if len(tries) < 3:
            raise OSError(errno.EADDRINUSE, "Address already in use")
        if len(tries) < 5:
            raise OSError("no errno: as the mock engine's gRPC bind says it")
        return port

    assert ports.bind_in_range(bind) == tries[-1]
    assert len(tries) == 5
