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

from switchyard.preprocessor import request_ids
from switchyard.preprocessor.access_log import CLIENT_GONE, AccessLog, request_fields
from switchyard.preprocessor.errors import INVALID_REQUEST, RequestError
from switchyard.preprocessor.stages.context import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    RESPONSES,
    SESSION_HEADER,
    Deps,
    Exchange,
)
from switchyard.preprocessor.stages.endpoints import ID_PREFIX, serve

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


class ClientGone(Exception):
    """The client disconnected before its request body was read."""


class AsgiOut:
    """The response half of one ASGI exchange (stages.sinks.HttpOut); every response carries
    the request's X-Request-Id."""

    __slots__ = ("_send", "_id", "done")

    def __init__(self, send: Send, request_id: str) -> None:
        self._send = send
        self._id = (b"x-request-id", request_id.encode("latin-1"))
        self.done = False  # the last message went out: a disconnect now is the normal end

    async def start_stream(self) -> None:
        headers = [*STREAM_HEADERS, self._id]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def write(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_stream(self) -> None:
        self.done = True
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def respond(self, status: int, body: bytes) -> None:
        self.done = True
        headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), self._id]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})


class Edge:
    def __init__(
        self,
        app: FastAPI,
        deps: Deps | None,
        max_body_bytes: int,
        access_log: AccessLog | None = None,
    ) -> None:
        self.app = app
        self.deps = deps
        self.max_body_bytes = max_body_bytes
        self.access_log = access_log  # None: --no-access-log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = GENERATION_PATHS.get(scope["path"])
            if endpoint is not None:
                await self._generate(endpoint, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _generate(self, endpoint: str, scope: Scope, receive: Receive, send: Send) -> None:
        received = time.perf_counter()
        deps = self.deps
        assert deps is not None
        exchange, refused = _exchange(endpoint, scope, deps)
        http = AsgiOut(send, exchange.request_id)
        status = CLIENT_GONE
        try:
            if refused is not None:
                raise refused
            body = await self._body(receive)
            status = await _until_client_leaves(
                serve(deps, endpoint, body, received, http, exchange), receive, http
            )
        except ClientGone:
            pass
        except RequestError as exc:
            exchange.error = exc.code
            status = exc.status
            await http.respond(exc.status, exc.body())
        finally:
            _account(deps, endpoint, exchange, status)
            if self.access_log is not None:
                self.access_log.write("POST", exchange, status)

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


def _exchange(endpoint: str, scope: Scope, deps: Deps) -> tuple[Exchange, RequestError | None]:
    """The request's ids (X-Request-Id or minted) and trace; the error of a bad header."""
    header = traceparent = session = None
    for name, value in scope["headers"]:
        if name == request_ids.HEADER:
            header = value
        elif name == b"traceparent":
            traceparent = value
        elif name == _SESSION:
            session = value
    refused: RequestError | None = None
    exchange: Exchange | None = None
    if header is not None:
        try:
            exchange = Exchange(scope["path"], *request_ids.from_header(header))
        except RequestError as exc:
            refused = exc
    if exchange is None:
        exchange = Exchange(scope["path"], request_ids.mint(ID_PREFIX[endpoint]))
    if session:
        exchange.session_id = bytes(session).decode("latin-1")
    if deps.tracing is not None:
        carrier = {"traceparent": traceparent.decode("latin-1")} if traceparent else {}
        exchange.trace = deps.tracing.start(
            f"POST {scope['path']}", carrier, {"switchyard.request_id": exchange.request_id}
        )
    return exchange, refused


def _account(deps: Deps, endpoint: str, exchange: Exchange, status: int) -> None:
    """Count the request (by model) and end its trace."""
    ctx = exchange.ctx
    model = ctx.state.entry.name if ctx is not None and ctx.state.entry is not None else ""
    metrics = deps.metrics
    metrics.requests.labels(endpoint, model, str(status)).inc()
    if exchange.error:
        metrics.errors.labels(model, exchange.error).inc()
    if exchange.trace is not None:
        fields = request_fields(exchange, status, deps.instances(), time.perf_counter())
        attributes = {f"switchyard.{k}": v for k, v in fields.items() if v is not None}
        exchange.trace.end(status, exchange.error, attributes)


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
