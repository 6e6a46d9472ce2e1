"""The generation endpoints as plain ASGI, in front of the FastAPI app.

Through FastAPI every streamed chunk passes the send wrappers of its middleware, and
StreamingResponse (uvicorn speaks ASGI spec 2.3) runs an anyio task group per request to
notice a client that went away. Here POST /v1/chat/completions and /v1/completions go straight
to `app.generation` and their frames straight to uvicorn's send; one plain task per stream
watches for the disconnect. Every other request, and the lifespan, is FastAPI's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fastapi import FastAPI
from starlette.responses import Response

from switchyard.preprocessor.app import SESSION_HEADER, STREAM_HEADERS, EventStream, generation
from switchyard.preprocessor.errors import INVALID_REQUEST, RequestError
from switchyard.preprocessor.state import PreprocessorState

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Any
Send = Any

GENERATION_PATHS = {"/v1/chat/completions": True, "/v1/completions": False}
_STREAM_START_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")] + [
    (name.lower().encode(), value.encode()) for name, value in STREAM_HEADERS.items()
]
_END = {"type": "http.response.body", "body": b"", "more_body": False}


_SESSION = SESSION_HEADER.encode()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


class ClientGone(Exception):
    """The client disconnected before its request body was read."""


class FastPath:
    def __init__(self, app: FastAPI, state: PreprocessorState, max_body_bytes: int) -> None:
        self.app = app
        self.state = state
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            chat = GENERATION_PATHS.get(scope["path"])
            if chat is not None:
                await self._generate(scope, receive, send, chat)
                return
        await self.app(scope, receive, send)

    async def _generate(self, scope: Scope, receive: Receive, send: Send, chat: bool) -> None:
        started = time.perf_counter()
        try:
            body = await self._body(receive)
        except ClientGone:
            return
        except RequestError as exc:
            await Response(exc.body(), exc.status, media_type="application/json")(
                scope, receive, send
            )
            return
        answer = await generation(self.state, body, chat, started, _header(scope, _SESSION))
        if isinstance(answer, EventStream):
            await _send_stream(answer, receive, send)
        else:
            await answer(scope, receive, send)

    async def _body(self, receive: Receive) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise RequestError(
                    413,
                    f"The request body is larger than {self.max_body_bytes} bytes.",
                    INVALID_REQUEST,
                    "request_too_large",
                )
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


async def _send_stream(answer: EventStream, receive: Receive, send: Send) -> None:
    """Writes each frame as it comes. If the client goes away, the stream is closed (which
    cancels the generation on the engine)."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.create_task(watch())
    frames = answer.frames
    try:
        await send({"type": "http.response.start", "status": 200, "headers": _STREAM_START_HEADERS})
        async for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send(_END)
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()  # the client went away: nothing left to do for it
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await frames.aclose()  # type: ignore[attr-defined]
