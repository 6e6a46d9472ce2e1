"""The KV handover between a prefill and a decode engine over TCP: the prefill side's server
(SGLang: its bootstrap port; vLLM: its side channel) and the decode side's `fetch_kv`.

Wire (the mock's own; the real engines move KV with RDMA): each frame is a 4-byte big-endian
length and a msgpack map. One fetch per connection:

    decode -> prefill   {"op": "fetch", "room": 12, "wait_s": 9.5}
                        {"op": "fetch", "request_id": "r1", "block_ids": [0, 1], "wait_s": 0}
    prefill -> decode   {"ok": true, "token_ids": [...], "first_token": 7, "block_ids": [...],
                         "engine_id": "..."}
                     or {"ok": false, "error": "unknown" | "expired" | "timeout" | "mismatch"
                         | "bad_request", "message": "..."}
    decode -> prefill   {"op": "ack"}    (after an ok: the KV arrived; the prefill releases it)

The prefill side waits up to min(wait_s, its own limit) for a room that is not offered yet
(SGLang sends both requests at once, the decode may ask first); a request id must be offered
already (vLLM is sequential). Without the ack (the decode gave up, the connection broke) the
KV is put back for another fetch until its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from switchyard.mock_engine.errors import HandoverMissing, KvTransferFailed, TransferKey
from switchyard.mock_engine.kv_handover import (
    HandoverBoard,
    KvPayload,
    describe,
    request_key,
    room_key,
)

logger = logging.getLogger(__name__)

MAX_FRAME = 64 << 20
ACK_TIMEOUT_S = 5.0  # the prefill side's wait for a decode's ack
REQUEST_TIMEOUT_S = 5.0  # the prefill side's wait for a fetch on a new connection
CONNECT_RETRY_S = 0.05

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class _FrameError(Exception):
    pass


async def _read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    header = await reader.readexactly(4)
    size = int.from_bytes(header, "big")
    if size > MAX_FRAME:
        raise _FrameError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    try:
        message = _decoder.decode(await reader.readexactly(size))
    except msgspec.DecodeError as exc:
        raise _FrameError(f"not msgpack: {exc}") from None
    if not isinstance(message, dict):
        raise _FrameError("a frame must be a map")
    return message


async def _write_frame(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    body = _encoder.encode(message)
    writer.write(len(body).to_bytes(4, "big") + body)
    await writer.drain()


def _key_of(message: dict[str, Any]) -> TransferKey:
    room, request_id = message.get("room"), message.get("request_id")
    if isinstance(room, int) and not isinstance(room, bool):
        return room_key(room)
    if isinstance(request_id, str) and request_id:
        return request_key(request_id)
    raise _FrameError("a fetch names a room (int) or a request_id (str)")


class KvTransferServer:
    """The prefill side's TCP listener over a HandoverBoard."""

    def __init__(
        self,
        board: HandoverBoard,
        *,
        max_wait_s: float,
        on_fetch: Callable[[], None] | None = None,
    ) -> None:
        self.board = board
        self.max_wait_s = max_wait_s
        self._on_fetch = on_fetch  # fault injection: called as a fetch arrives
        self.port = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.internal_errors = 0  # fetches that failed on an unforeseen exception

    @property
    def connections(self) -> int:
        """Fetches being served now (a decode waiting for a room included)."""
        return len(self._handlers)

    async def start(self, host: str, port: int) -> int:
        """Bind and serve; the bound port (`port` 0: any free one)."""
        self._server = await asyncio.start_server(self._accept, host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        await server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, _FrameError) as exc:
            logger.debug("kv transfer connection ended: %s", exc)
        except Exception as exc:  # a bug: the decode side still gets an answer, not silence
            logger.exception("kv transfer fetch failed unexpectedly")
            self.internal_errors += 1
            with contextlib.suppress(OSError):
                reply = {"ok": False, "error": "internal", "message": f"{type(exc).__name__}"}
                await _write_frame(writer, reply)
        finally:
            if task is not None:
                self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        peer_name = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        message = await asyncio.wait_for(_read_frame(reader), REQUEST_TIMEOUT_S)
        if self._on_fetch is not None:
            self._on_fetch()
        try:
            if message.get("op") != "fetch":
                raise _FrameError(f"unknown op {message.get('op')!r}")
            key = _key_of(message)
            wait_s = float(message.get("wait_s") or 0.0)
        except (_FrameError, TypeError, ValueError) as exc:
            await _write_frame(writer, {"ok": False, "error": "bad_request", "message": str(exc)})
            return
        try:
            payload = await self.board.claim(key, min(max(wait_s, 0.0), self.max_wait_s))
        except HandoverMissing as exc:
            await _write_frame(writer, {"ok": False, "error": exc.reason, "message": str(exc)})
            return
        acked = False
        try:
            wanted = message.get("block_ids")
            if wanted is not None and tuple(wanted) != payload.block_ids:
                reply = {
                    "ok": False,
                    "error": "mismatch",
                    "message": f"block ids {wanted} are not those of {describe(key)}",
                }
                await _write_frame(writer, reply)
                return
            reply = {
                "ok": True,
                "token_ids": list(payload.token_ids),
                "first_token": payload.first_token,
                "block_ids": list(payload.block_ids),
                "engine_id": payload.engine_id,
            }
            await _write_frame(writer, reply)
            ack = await asyncio.wait_for(_read_frame(reader), ACK_TIMEOUT_S)
            acked = ack.get("op") == "ack"
        finally:
            if acked:
                self.board.confirm(key, peer_name)
            else:
                self.board.unclaim(key)


async def fetch_kv(
    host: str,
    port: int,
    key: TransferKey,
    *,
    timeout_s: float,
    wait: bool,
    block_ids: list[int] | None = None,
) -> KvPayload:
    """Take over the KV under `key` from the prefill engine at host:port.

    `wait`: the prefill may not have offered it yet (SGLang): retry connecting and let the
    prefill side wait, all within `timeout_s`. Otherwise (vLLM) it must be there now.
    KvTransferFailed on any failure (reason "unreachable" when no connection could be made).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    where = f"{host}:{port}"
    request: dict[str, Any] = {"op": "fetch"}
    request["room" if key[0] == "room" else "request_id"] = key[1]
    if block_ids is not None:
        request["block_ids"] = block_ids
    while True:
        try:
            remaining = deadline - loop.time()
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), max(remaining, 0.001)
            )
            break
        except (OSError, TimeoutError) as exc:
            if not wait or loop.time() + CONNECT_RETRY_S >= deadline:
                raise KvTransferFailed(
                    key, "unreachable", f"cannot reach the prefill engine at {where}: {exc}"
                ) from None
            await asyncio.sleep(CONNECT_RETRY_S)
    try:
        request["wait_s"] = max(0.0, deadline - loop.time()) if wait else 0.0
        await _write_frame(writer, request)
        grace = 1.0  # the prefill side answers "timeout" itself at wait_s
        reply = await asyncio.wait_for(_read_frame(reader), deadline - loop.time() + grace)
        if not reply.get("ok"):
            reason = str(reply.get("error") or "failed")
            message = str(reply.get("message") or reason)
            raise KvTransferFailed(key, reason, f"{message} (prefill engine {where})")
        payload = KvPayload(
            token_ids=tuple(int(t) for t in reply.get("token_ids") or ()),
            first_token=reply.get("first_token"),
            block_ids=tuple(int(b) for b in reply.get("block_ids") or ()),
            engine_id=str(reply.get("engine_id") or ""),
        )
        await _write_frame(writer, {"op": "ack"})
        return payload
    except (OSError, asyncio.IncompleteReadError, TimeoutError, _FrameError) as exc:
        detail = str(exc) or type(exc).__name__
        raise KvTransferFailed(
            key, "broken", f"KV transfer from {where} failed: {detail}"
        ) from None
    except (TypeError, ValueError, AttributeError) as exc:  # a reply of the wrong shape
        raise KvTransferFailed(
            key, "broken", f"KV transfer from {where}: malformed reply ({exc})"
        ) from None
    except KvTransferFailed:
        raise
    except Exception as exc:  # never let the decode request hang on an unforeseen error
        logger.exception("kv fetch from %s failed unexpectedly", where)
        raise KvTransferFailed(
            key, "broken", f"KV transfer from {where} failed: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
