"""The C extension's ZMQ_EVENTS read (libs/common/_zmqevents.c) against pyzmq's."""

import time

import pytest
import zmq

from switchyard.common import messaging
from switchyard.common.messaging import py_events
from switchyard.common.native import load

built = load("switchyard.common._zmqevents")
pytestmark = pytest.mark.skipif(built is None, reason="the C extension is not built")
native = built.events if built is not None else None


def both(sock: zmq.Socket) -> int:
    assert native is not None
    ours, theirs = native(sock), py_events(sock)
    assert type(ours) is int and ours == theirs
    return ours


def wait_for(sock: zmq.Socket, flag: int) -> None:
    deadline = time.monotonic() + 10
    while not py_events(sock) & flag:  # ZMQ's I/O thread delivers on its own schedule
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_extension_is_the_one_in_use() -> None:
    assert messaging.events is native


def test_same_events_in_every_state_of_a_pair() -> None:
    ctx = zmq.Context()
    server, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        server.bind("tcp://127.0.0.1:*")
        assert both(client) == 0  # no peer: nothing to read, nowhere to send
        client.connect(messaging.bound_endpoint(server))
        wait_for(client, zmq.POLLOUT)
        assert both(client) == zmq.POLLOUT
        client.send(b"ping")
        wait_for(server, zmq.POLLIN)
        assert both(server) == zmq.POLLIN | zmq.POLLOUT
        identity, _ = server.recv_multipart()
        assert both(server) == zmq.POLLOUT
        server.send_multipart([identity, b"pong"])
        wait_for(client, zmq.POLLIN)
        assert both(client) == zmq.POLLIN | zmq.POLLOUT
    finally:
        server.close(linger=0)
        client.close(linger=0)
        ctx.term()


@pytest.mark.parametrize("how", ["close", "destroy"])
def test_a_closed_socket_raises_as_pyzmq_does(how: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    if how == "close":
        sock.close(linger=0)
    else:
        ctx.destroy(linger=0)
    assert native is not None
    with pytest.raises(zmq.ZMQError) as ours:
        native(sock)
    with pytest.raises(zmq.ZMQError) as theirs:
        py_events(sock)
    assert type(ours.value) is type(theirs.value)
    assert ours.value.errno == theirs.value.errno == zmq.ENOTSOCK
    ctx.term()
