"""LoopSocket: ZMQ sockets driven from the event loop (real sockets over inproc/tcp)."""

import asyncio
import time

import pytest
import zmq
import zmq.asyncio

from switchyard.common.messaging import (
    DealerClient,
    LoopSocket,
    decode_routed,
    new_socket,
    recv_multipart_now,
)
from switchyard.protos import codec


async def until(predicate, what: str, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.001)


@pytest.fixture
async def ctx():
    context = zmq.asyncio.Context()
    yield context
    context.term()


@pytest.fixture
def endpoint(tmp_path):
    return f"ipc://{tmp_path}/s"


async def test_request_reply_both_ways(ctx, endpoint):
    """A ROUTER answering a DEALER, both LoopSockets: every message arrives, in order."""
    server_got: list[list[bytes]] = []
    client_got: list[bytes] = []

    def serve(frames: list[bytes]) -> None:
        server_got.append(frames)
        server.send_multipart([frames[0], b"re:" + frames[1]])

    server = LoopSocket(
        new_socket(ctx, zmq.ROUTER, bind=endpoint, sync=True), serve, multipart=True
    )
    client = LoopSocket(
        new_socket(ctx, zmq.DEALER, connect=[endpoint], sync=True), client_got.append,
        multipart=False,
    )  # fmt: skip
    try:
        for i in range(500):
            client.send(b"%d" % i)
        await until(lambda: len(client_got) == 500, "replies")
        assert client_got == [b"re:%d" % i for i in range(500)]
        assert [f[1] for f in server_got] == [b"%d" % i for i in range(500)]
    finally:
        client.close()
        server.close()


async def test_multipart_messages_keep_their_frames(ctx, endpoint):
    """Messages of several frames (and empty frames) cross whole, both ways."""
    server_got: list[list[bytes]] = []
    client_got: list[list[bytes]] = []

    def serve(frames: list[bytes]) -> None:
        server_got.append(frames)
        server.send_multipart([frames[0], b"", *frames[1:]])

    server = LoopSocket(
        new_socket(ctx, zmq.ROUTER, bind=endpoint, sync=True), serve, multipart=True
    )
    client = LoopSocket(
        new_socket(ctx, zmq.DEALER, connect=[endpoint], sync=True), client_got.append,
        multipart=True,
    )  # fmt: skip
    try:
        for i in range(50):
            client.send_multipart([b"%d" % i, b"x" * i, b""])
        await until(lambda: len(client_got) == 50, "replies")
        assert client_got == [[b"", b"%d" % i, b"x" * i, b""] for i in range(50)]
        assert [f[1:] for f in server_got] == [[b"%d" % i, b"x" * i, b""] for i in range(50)]
    finally:
        client.close()
        server.close()


def test_recv_multipart_now_raises_again_when_nothing_is_there():
    context = zmq.Context()
    try:
        sock = new_socket(context, zmq.PULL, bind="inproc://empty")
        with pytest.raises(zmq.Again):
            recv_multipart_now(sock)
        sock.close()
    finally:
        context.term()


async def test_messages_queued_before_the_socket_is_driven_are_read(ctx, endpoint):
    raw = new_socket(ctx, zmq.PULL, bind=endpoint, sync=True)
    push = new_socket(ctx, zmq.PUSH, connect=[endpoint], sync=True)
    push.send(b"early")
    await asyncio.sleep(0.05)  # the message now waits in the PULL socket, the FD edge is gone
    got: list[bytes] = []
    sock = LoopSocket(raw, got.append, multipart=False)
    try:
        await until(lambda: got == [b"early"], "the early message")
        push.send(b"late")
        await until(lambda: got == [b"early", b"late"], "the late message")
    finally:
        sock.close()
        push.close(linger=0)


async def test_a_reply_that_arrives_while_sending_is_not_missed(ctx, endpoint):
    """ZMQ's FD is edge-triggered and a send can swallow the edge of an incoming message:
    a ping-pong where every reply is answered from the handler must keep going."""
    rounds: list[bytes] = []

    def bounce(frames: list[bytes]) -> None:
        server.send_multipart(frames)

    def again(frame: bytes) -> None:
        rounds.append(frame)
        if len(rounds) < 300:
            client.send(frame)

    server = LoopSocket(
        new_socket(ctx, zmq.ROUTER, bind=endpoint, sync=True), bounce, multipart=True
    )
    client = LoopSocket(
        new_socket(ctx, zmq.DEALER, connect=[endpoint], sync=True), again, multipart=False
    )
    try:
        client.send(b"x")
        await until(lambda: len(rounds) == 300, "300 rounds")
    finally:
        client.close()
        server.close()


async def test_a_message_whose_wake_up_a_send_swallowed_is_still_read(ctx, endpoint):
    """The reply lands while the loop is busy and a send from the same socket then processes
    ZMQ's pending commands, which clears the FD: the socket must still read the reply."""
    got: list[bytes] = []
    server = new_socket(ctx, zmq.ROUTER, bind=endpoint, sync=True)
    client = LoopSocket(
        new_socket(ctx, zmq.DEALER, connect=[endpoint], sync=True), got.append, multipart=False
    )
    try:
        client.send(b"hello")
        assert server.poll(5000)
        identity, _ = server.recv_multipart()
        await asyncio.sleep(0.05)
        server.send_multipart([identity, b"reply"])
        time.sleep(0.05)  # the loop is busy: the reply arrives and wakes the FD meanwhile
        client.send(b"more")  # processes ZMQ's commands: the wake-up is consumed
        await until(lambda: got == [b"reply"], "the reply")
    finally:
        client.close()
        server.close(linger=0)


async def test_router_send_to_a_gone_peer_raises(ctx, endpoint):
    server = LoopSocket(
        new_socket(ctx, zmq.ROUTER, bind=endpoint, sync=True), lambda f: None, multipart=True
    )
    try:
        with pytest.raises(zmq.ZMQError):
            server.send_multipart([b"nobody", b"hello"])
    finally:
        server.close()


async def test_a_failing_handler_does_not_stop_the_socket(ctx, endpoint):
    got: list[bytes] = []

    def handle(frame: bytes) -> None:
        if frame == b"bad":
            raise ValueError("boom")
        got.append(frame)

    raw = new_socket(ctx, zmq.PULL, bind=endpoint, sync=True)
    push = new_socket(ctx, zmq.PUSH, connect=[endpoint], sync=True)
    sock = LoopSocket(raw, handle, multipart=False)
    try:
        for frame in (b"a", b"bad", b"b"):
            push.send(frame)
        await until(lambda: got == [b"a", b"b"], "the good messages")
    finally:
        sock.close()
        push.close(linger=0)


async def test_dealer_client_decodes_and_hands_over_replies(ctx, endpoint):
    got: list[object] = []

    class Client(DealerClient):
        def handle(self, reply):
            got.append(reply)

    router = new_socket(ctx, zmq.ROUTER, bind=endpoint)
    client = Client(endpoint, codec.dispatcher_replies, ctx)
    client.start()
    try:
        client.send_now({"hello": 1})  # any msgpack: the router only echoes its identity
        identity, _ = await router.recv_multipart()
        await router.send_multipart([identity, b"\xc1"])  # undecodable: logged and skipped
        await router.send_multipart([identity, codec.encode([])])
        await until(lambda: got == [[]], "the decoded reply")
    finally:
        await client.close()
        router.close(linger=0)


def test_decode_routed():
    decoder = codec.dispatcher_replies
    assert decode_routed([b"peer", codec.encode([])], decoder, "x") == (b"peer", [])
    assert decode_routed([b"peer"], decoder, "x") is None
    assert decode_routed([b"peer", b"\xc1"], decoder, "x") is None
