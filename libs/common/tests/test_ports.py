import socket

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
