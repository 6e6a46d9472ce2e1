"""The KV handover over TCP: the prefill side's server and the decode side's fetch_kv."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio
from support.mock_engine import free_port, wait_until

from switchyard.mock_engine.errors import KvTransferFailed
from switchyard.mock_engine.kv_handover import HandoverBoard, KvPayload, request_key, room_key
from switchyard.mock_engine.kv_transfer import KvTransferServer, fetch_kv

PAYLOAD = KvPayload((5, 6, 7, 8), 3, (10, 11), "engine-1")
LONG = 60.0


class Releases:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@pytest_asyncio.fixture
async def server() -> AsyncIterator[KvTransferServer]:
    transfer = KvTransferServer(HandoverBoard(), max_wait_s=LONG)
    await transfer.start("127.0.0.1", 0)
    try:
        yield transfer
    finally:
        transfer.board.close()
        await transfer.stop()


async def fetch(server: KvTransferServer, key: object, **kwargs: object) -> KvPayload:
    return await fetch_kv("127.0.0.1", server.port, key, **kwargs)  # type: ignore[arg-type]


class TestFetch:
    async def test_request_id_with_block_ids(self, server: KvTransferServer) -> None:
        release = Releases()
        picked = server.board.offer(request_key("r1"), PAYLOAD, release=release, deadline_s=LONG)
        got = await fetch(server, request_key("r1"), timeout_s=5, wait=False, block_ids=[10, 11])
        assert got == PAYLOAD
        assert await picked is True and release.count == 1
        assert server.board.counters.handed_over == 1

    async def test_room_offered_after_the_fetch_began(self, server: KvTransferServer) -> None:
        fetching = asyncio.ensure_future(fetch(server, room_key(4), timeout_s=LONG, wait=True))
        await asyncio.sleep(0.02)
        assert not fetching.done()
        picked = server.board.offer(room_key(4), PAYLOAD, release=Releases(), deadline_s=LONG)
        assert (await fetching).token_ids == PAYLOAD.token_ids
        assert await picked is True

    async def test_unknown_request(self, server: KvTransferServer) -> None:
        with pytest.raises(KvTransferFailed) as raised:
            await fetch(server, request_key("ghost"), timeout_s=5, wait=False)
        assert raised.value.reason == "unknown" and "ghost" in str(raised.value)

    async def test_expired_request(self, server: KvTransferServer) -> None:
        picked = server.board.offer(request_key("old"), PAYLOAD, release=Releases(), deadline_s=0)
        assert await picked is False
        with pytest.raises(KvTransferFailed) as raised:
            await fetch(server, request_key("old"), timeout_s=5, wait=False)
        assert raised.value.reason == "expired" and "old" in str(raised.value)

    async def test_block_id_mismatch_puts_it_back(self, server: KvTransferServer) -> None:
        server.board.offer(request_key("r"), PAYLOAD, release=Releases(), deadline_s=LONG)
        with pytest.raises(KvTransferFailed) as raised:
            await fetch(server, request_key("r"), timeout_s=5, wait=False, block_ids=[1])
        assert raised.value.reason == "mismatch"
        got = await fetch(server, request_key("r"), timeout_s=5, wait=False, block_ids=[10, 11])
        assert got == PAYLOAD

    async def test_room_never_offered_times_out(self, server: KvTransferServer) -> None:
        with pytest.raises(KvTransferFailed) as raised:
            await fetch(server, room_key(9), timeout_s=0.05, wait=True)
        assert raised.value.reason == "timeout" and "room=9" in str(raised.value)

    async def test_nobody_listening(self) -> None:
        port = free_port()
        with pytest.raises(KvTransferFailed) as raised:
            await fetch_kv("127.0.0.1", port, room_key(1), timeout_s=0.1, wait=True)
        assert raised.value.reason == "unreachable"

    async def test_no_ack_puts_it_back(self, server: KvTransferServer) -> None:
        release = Releases()
        picked = server.board.offer(room_key(8), PAYLOAD, release=release, deadline_s=LONG)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        body = msgspec.msgpack.encode({"op": "fetch", "room": 8, "wait_s": 0})
        writer.write(len(body).to_bytes(4, "big") + body)
        await writer.drain()
        size = int.from_bytes(await reader.readexactly(4), "big")
        reply = msgspec.msgpack.decode(await reader.readexactly(size))
        assert reply["ok"] and reply["token_ids"] == list(PAYLOAD.token_ids)
        writer.close()  # gone without the ack
        await writer.wait_closed()
        got = await fetch(server, room_key(8), timeout_s=5, wait=True)
        assert got == PAYLOAD
        assert await picked is True  # the ack arrived: released once, counted once
        assert release.count == 1 and server.board.counters.handed_over == 1

    async def test_bad_request_is_answered(self, server: KvTransferServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        body = msgspec.msgpack.encode({"op": "fetch"})
        writer.write(len(body).to_bytes(4, "big") + body)
        await writer.drain()
        size = int.from_bytes(await reader.readexactly(4), "big")
        reply = msgspec.msgpack.decode(await reader.readexactly(size))
        writer.close()
        await writer.wait_closed()
        assert reply["ok"] is False and reply["error"] == "bad_request"

    async def test_stop_ends_waiting_connections(self) -> None:
        transfer = KvTransferServer(HandoverBoard(), max_wait_s=LONG)
        await transfer.start("127.0.0.1", 0)
        fetching = asyncio.ensure_future(
            fetch_kv("127.0.0.1", transfer.port, room_key(1), timeout_s=LONG, wait=True)
        )
        await wait_until(lambda: transfer.connections == 1)
        transfer.board.close()
        await transfer.stop()
        with pytest.raises(KvTransferFailed):
            await fetching
