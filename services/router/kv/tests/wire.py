"""Test helpers that speak the engines' real KV-event wire (ARCHITECTURE.md, "KV events"):
event and payload builders, and a fake engine publisher (PUB + replay ROUTER)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from switchyard.common.ports import free_port

END = b"\xff" * 8
DEADLINE = 10.0


async def until(predicate: Callable[[], object], what: str, deadline: float = DEADLINE) -> None:
    """Poll `predicate` until true; fail (not sleep-assert) after `deadline` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


# ---- events --------------------------------------------------------------------------------


def stored_array(
    hashes: list[Any],
    parent: Any,
    tokens: list[int],
    block_size: int,
    lora_id: Any = None,
    medium: Any = "GPU",
    *extra: Any,
) -> list[Any]:
    return ["BlockStored", hashes, parent, tokens, block_size, lora_id, medium, *extra]


def stored_map(
    hashes: list[Any], parent: Any, tokens: list[int], block_size: int, **extra: Any
) -> dict[str, Any]:
    event = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
    }
    event.update(extra)
    return event


def removed_array(hashes: list[Any], medium: Any = "GPU", *extra: Any) -> list[Any]:
    return ["BlockRemoved", hashes, medium, *extra]


def removed_map(hashes: list[Any], **extra: Any) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", **extra}


def cleared_array() -> list[Any]:
    return ["AllBlocksCleared"]


def payload(events: list[Any], ts: float = 1.5, dp_rank: int | None = 0) -> bytes:
    body: list[Any] = [ts, events]
    if dp_rank is not None:
        body.append(dp_rank)
    return msgspec.msgpack.encode(body)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def chain_events(
    tokens: list[int], block_size: int, first_hash: int, parent: int | None = None, per: int = 2
) -> list[list[Any]]:
    """One BlockStored per `per` blocks covering `tokens`, engine hashes first_hash, +1, ...
    each event chained to the previous one's last block."""
    events = []
    n = len(tokens) // block_size
    h = first_hash
    for start in range(0, n, per):
        count = min(per, n - start)
        hashes = list(range(h, h + count))
        chunk = tokens[start * block_size : (start + count) * block_size]
        events.append(stored_array(hashes, parent, chunk, block_size))
        parent = hashes[-1]
        h += count
    return events


# ---- fake engine publisher -----------------------------------------------------------------


def _bind(sock: zmq.Socket[Any], endpoint: str, tries: int = 50) -> None:
    """Bind, retrying while the port is still held by a socket just closed (ZMQ closes in
    its I/O thread, after close() returned); the socket is closed if it never binds."""
    for attempt in range(tries):
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or attempt == tries - 1:
                sock.close(linger=0)
                raise
            time.sleep(0.02)


class FakePublisher:
    """An engine's KV-event sockets: an XPUB (a PUB to its subscribers; XPUB lets the test
    wait for the subscription instead of sleeping) and a replay ROUTER serving its buffer.

    `publish(events)` numbers and buffers a batch and sends it unless `send=False` (a batch
    the subscriber misses). `restart()` empties the buffer and restarts numbering at 0.
    `four_frames` answers replays as [b"", topic, seq, payload] (newer vLLM).
    `replay_silent` never answers replays (timeout tests). `connect_to` connects the PUB to a
    bound SUB (an engine whose endpoint names a host) instead of binding it. `ports` (PUB,
    replay) binds given ports: a publisher that comes (back) where a subscriber waits."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        topic: bytes = b"",
        connect_to: str | None = None,
        ports: tuple[int, int] | None = None,
    ) -> None:
        self.topic = topic
        chosen: tuple[int, int] = ports or (free_port(), free_port())
        self.pub_port, self.replay_port = chosen
        self.endpoint = f"tcp://127.0.0.1:{self.pub_port}"
        self.replay_endpoint = f"tcp://127.0.0.1:{self.replay_port}"
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if connect_to is None:
            _bind(self.pub, f"tcp://127.0.0.1:{self.pub_port}")
        else:
            self.endpoint = connect_to
            self.pub.connect(connect_to)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        _bind(self.router, self.replay_endpoint)
        self.buffer: list[tuple[int, bytes]] = []
        self.next_seq = 0
        self.four_frames = False
        self.replay_silent = False
        self.replay_requests: list[int] = []
        self._replayer = asyncio.create_task(self._serve_replay())

    async def wait_subscribed(self, timeout: float = DEADLINE) -> None:
        if not await self.pub.poll(int(timeout * 1000), zmq.POLLIN):  # type: ignore[call-arg]
            raise AssertionError("no subscriber connected")
        await self.pub.recv()  # b"\x01" + topic

    async def publish(self, events: list[Any], *, send: bool = True) -> int:
        seq = self.next_seq
        self.next_seq += 1
        body = payload(events)
        self.buffer.append((seq, body))
        if send:
            await self.pub.send_multipart([self.topic, seq_bytes(seq), body])
        return seq

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.pub.send_multipart(frames)

    def restart(self) -> None:
        self.buffer = []
        self.next_seq = 0

    async def _serve_replay(self) -> None:
        while True:
            identity, _empty, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            if self.replay_silent:
                continue
            for seq, body in list(self.buffer):
                if seq >= first:
                    frames = [identity, b"", seq_bytes(seq), body]
                    if self.four_frames:
                        frames.insert(2, self.topic)
                    with contextlib.suppress(zmq.ZMQError):
                        await self.router.send_multipart(frames)
            with contextlib.suppress(zmq.ZMQError):
                await self.router.send_multipart([identity, b"", END, b""])

    async def close(self) -> None:
        self._replayer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._replayer
        self.pub.close(linger=0)
        self.router.close(linger=0)
