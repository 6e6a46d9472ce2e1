"""The HTTP edge: generation endpoints as plain ASGI, in front of the FastAPI app.

Through FastAPI every streamed chunk would pass the send wrappers of its middleware, and
StreamingResponse (uvicorn speaks ASGI spec 2.3) runs an anyio task group per request. Here
POST /v1/chat/completions, /v1/completions, /v1/embeddings and /v1/responses read their body
(413 past --max-body-bytes) and go straight to the stages (stages/endpoints.serve), whose
frames go straight to uvicorn's send. One plain task per request watches for the client
going away, streaming or not: the request is then cancelled, which aborts its engine
requests. Every other request, and the lifespan, is FastAPI's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fastapi import FastAPI

from switchyard.preprocessor.errors import INVALID_REQUEST, RequestError
from switchyard.preprocessor.stages.context import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    RESPONSES,
    SESSION_HEADER,
    Deps,
)
from switchyard.preprocessor.stages.endpoints import serve

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Any
Send = Any

GENERATION_PATHS = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/responses": RESPONSES,
}
STREAM_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
JSON_HEADERS = [(b"content-type", b"application/json")]
_SESSION = SESSION_HEADER.encode()
CLIENT_GONE = 499  # the status counted for a request whose client went away


class ClientGone(Exception):
    """The client disconnected before its request body was read."""


class AsgiOut:
    """The response half of one ASGI exchange (stages.sinks.HttpOut)."""

    __slots__ = ("_send", "done")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.done = False  # the last message went out: a disconnect now is the normal end

    async def start_stream(self) -> None:
        await self._send({"type": "http.response.start", "status": 200, "headers": STREAM_HEADERS})

    async def write(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_stream(self) -> None:
        self.done = True
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def respond(self, status: int, body: bytes) -> None:
        self.done = True
        headers = JSON_HEADERS + [(b"content-length", str(len(body)).encode())]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})


class Edge:
    def __init__(self, app: FastAPI, deps: Deps | None, max_body_bytes: int) -> None:
        self.app = app
        self.deps = deps
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = GENERATION_PATHS.get(scope["path"])
            if endpoint is not None:
                await self._generate(endpoint, _header(scope, _SESSION), receive, send)
                return
        await self.app(scope, receive, send)

    async def _generate(
        self, endpoint: str, session_id: str | None, receive: Receive, send: Send
    ) -> None:
        received = time.perf_counter()
        http = AsgiOut(send)
        try:
            body = await self._body(receive)
        except ClientGone:
            return
        except RequestError as exc:
            await http.respond(exc.status, exc.body())
            return
        deps = self.deps
        assert deps is not None
        status = await _until_client_leaves(
            serve(deps, endpoint, body, received, http, session_id), receive, http
        )
        deps.metrics.requests.labels(endpoint, str(status)).inc()

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


def _header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (ASGI names are lowercase bytes), None when absent."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def _until_client_leaves(answer: Any, receive: Receive, http: AsgiOut) -> int:
    """Run `answer` (a coroutine returning the status); a client that goes away before the
    answer is complete cancels it (its engine requests are then aborted)."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        if not http.done:
            gone = True
            task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        return await answer
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()  # the client went away: nothing left to do for it
        return CLIENT_GONE
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
