"""Outbox: replies batched per peer and per loop iteration, over a real ROUTER/DEALER pair."""

import asyncio

import pytest
import zmq
import zmq.asyncio

from switchyard.common.messaging import LoopSocket, new_socket
from switchyard.dispatcher.outbox import Outbox
from switchyard.protos import codec
from switchyard.protos.messages import GenerateFinished, TokenDelta


@pytest.fixture
async def pair(tmp_path):
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tmp_path}/d"
    router = LoopSocket(
        new_socket(ctx, zmq.ROUTER, bind=endpoint, sync=True), lambda f: None, multipart=True
    )
    identities = [b"peer0", b"peer1"]
    dealers = []
    for identity in identities:
        dealer = new_socket(ctx, zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, identity)  # before connecting
        dealer.connect(endpoint)
        dealers.append(dealer)
    await asyncio.sleep(0.1)  # connected
    yield router, dealers, identities
    router.close()
    for dealer in dealers:
        dealer.close(linger=0)
    ctx.term()


async def recv(dealer) -> list:
    async with asyncio.timeout(5):
        return codec.dispatcher_replies.decode(await dealer.recv())


async def test_one_message_per_peer_per_loop_iteration(pair):
    router, (a, b), (id_a, id_b) = pair
    gone: list[bytes] = []
    outbox = Outbox(router, gone.append)
    outbox.post(id_a, TokenDelta("r1", [1]))
    outbox.post(id_b, TokenDelta("r2", [2]))
    outbox.post(id_a, TokenDelta("r3", [3]))
    outbox.post(
        id_a,
        GenerateFinished(
            request_id="r1", finish_reason="stop", prompt_tokens=1, completion_tokens=2
        ),
    )
    assert await recv(a) == [
        TokenDelta("r1", [1]),
        TokenDelta("r3", [3]),
        GenerateFinished(
            request_id="r1", finish_reason="stop", prompt_tokens=1, completion_tokens=2
        ),
    ]
    assert await recv(b) == [TokenDelta("r2", [2])]
    outbox.post(id_b, TokenDelta("r2", [4]))  # the next iteration: a new message
    assert await recv(b) == [TokenDelta("r2", [4])]
    assert gone == []


async def test_a_gone_peer_is_reported_and_the_others_still_served(pair):
    router, (a, _), (id_a, _) = pair
    gone: list[bytes] = []
    outbox = Outbox(router, gone.append)
    outbox.post(b"vanished", TokenDelta("r9", [9]))
    outbox.post(id_a, TokenDelta("r1", [1]))
    assert await recv(a) == [TokenDelta("r1", [1])]
    assert gone == [b"vanished"]


async def test_an_idle_outbox_sends_at_once_whatever_its_window(pair):
    router, (a, _), (id_a, _) = pair
    outbox = Outbox(router, lambda peer: None, window=3600.0)
    outbox.post(id_a, TokenDelta("r1", [1]))
    assert await recv(a) == [TokenDelta("r1", [1])]  # not an hour later


async def test_after_a_flush_replies_wait_for_the_window_and_go_together(pair):
    router, (a, _), (id_a, _) = pair
    loop = asyncio.get_running_loop()
    window = 0.3
    outbox = Outbox(router, lambda peer: None, window=window)
    before = loop.time()  # the first flush is later than this
    outbox.post(id_a, TokenDelta("r1", [1]))
    assert await recv(a) == [TokenDelta("r1", [1])]
    outbox.post(id_a, TokenDelta("r1", [2]))
    await asyncio.sleep(0)  # a later loop iteration: it still waits
    outbox.post(id_a, TokenDelta("r2", [3]))
    assert await recv(a) == [TokenDelta("r1", [2]), TokenDelta("r2", [3])]
    assert loop.time() >= before + window


def test_a_negative_window_is_refused():
    with pytest.raises(ValueError, match="reply window"):
        asyncio.run(_outbox_with_window(-1.0))


async def _outbox_with_window(window: float) -> None:
    Outbox(None, lambda peer: None, window=window)  # type: ignore[arg-type]
