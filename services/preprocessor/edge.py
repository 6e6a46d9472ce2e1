"""The HTTP edge: access checks for every route, and generation endpoints as plain ASGI, in front
of the FastAPI app.

Every request is checked first (auth.py): /v1 routes need a client key, the operator's routes
the admin token (or the admin listener); a 401 costs nothing but the headers. Through FastAPI
every streamed chunk would pass the send wrappers of its middleware, and StreamingResponse
(uvicorn speaks ASGI spec 2.3) runs an anyio task group per request. Here POST
/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses and /v1/messages take a
place in admission control (admission.py: 429 with Retry-After beyond its limits) before their
body is read (413 past --max-body-bytes), then go straight to the stages
(stages/endpoints.serve), whose frames go straight to uvicorn's send. One plain task per
request watches for the client going away, waiting for a slot, streaming or not: the request is
then cancelled, which aborts its engine requests. A request's deadline is --request-timeout, or
shorter with the client's `request-timeout-ms` header. Each request gets its id (X-Request-Id),
its access line and its trace here. /tokenize, /detokenize (also under /v1) and
/v1/messages/count_tokens are answered without an engine (local_endpoints): no admission slot.
Another method on those paths is 405 (Allow: POST). Errors on the Anthropic API's paths take
its shape (anthropic_requests), those before the body was read too. Every other request, and
the lifespan, is FastAPI's.
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
from switchyard.preprocessor.admission import Admission
from switchyard.preprocessor.anthropic_requests import anthropic_error
from switchyard.preprocessor.auth import (
    OPEN_PATHS,
    TENANT_SCOPE,
    Access,
    KeyRing,
    is_admin_path,
    is_client_path,
    tenant_of,
)
from switchyard.preprocessor.errors import (
    INVALID_REQUEST,
    AuthenticationError,
    RequestError,
    as_request_error,
    error_body,
)
from switchyard.preprocessor.local_endpoints import LOCAL
from switchyard.preprocessor.stages.context import (
    ANTHROPIC,
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    DETOKENIZE,
    EMBEDDINGS,
    MESSAGES,
    RESPONSES,
    SESSION_HEADER,
    TOKENIZE,
    Deps,
    RequestContext,
)
from switchyard.preprocessor.stages.endpoints import ID_PREFIX, new_request, serve

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Any
Send = Any

GENERATION_PATHS = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
}
# Answered without an engine (local_endpoints): no admission slot, no deadline.
LOCAL_PATHS = {
    "/v1/tokenize": TOKENIZE,
    "/tokenize": TOKENIZE,  # vLLM's paths
    "/v1/detokenize": DETOKENIZE,
    "/detokenize": DETOKENIZE,
    "/v1/messages/count_tokens": COUNT_TOKENS,
}
LOCAL_ID_PREFIX = {TOKENIZE: "tokenize-", DETOKENIZE: "tokenize-", COUNT_TOKENS: "msg_"}
# The paths of the Anthropic API: their errors take its shape, their answers its id header.
ANTHROPIC_PATHS = frozenset(
    path for path, e in {**GENERATION_PATHS, **LOCAL_PATHS}.items() if e in ANTHROPIC
)
STREAM_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
JSON_HEADERS = [(b"content-type", b"application/json")]
TIMEOUT_HEADER = b"request-timeout-ms"  # the client's deadline (the openai SDK's proposal)
_SESSION = SESSION_HEADER.encode()


class ClientGone(Exception):
    """The client disconnected before its request body was read."""


class AsgiOut:
    """The response half of one ASGI exchange (stages.sinks.HttpOut); every response of a
    request that has an id carries it as X-Request-Id."""

    __slots__ = ("_send", "_id", "_anthropic", "done", "added")

    def __init__(self, send: Send, request_id: str = "", anthropic: bool = False) -> None:
        self._send = send
        self._id: list[tuple[bytes, bytes]] = []
        self._anthropic = anthropic  # also the `request-id` header the Anthropic SDK reads
        self.set_request_id(request_id)
        self.done = False  # the last message went out: a disconnect now is the normal end
        # Headers the request's stages add (RequestContext.headers: a store warning).
        self.added: list[tuple[bytes, bytes]] = []

    def set_request_id(self, request_id: str) -> None:
        value = request_id.encode("latin-1")
        self._id = [(b"x-request-id", value)] if request_id else []
        if request_id and self._anthropic:
            self._id.append((b"request-id", value))

    async def start_stream(self) -> None:
        headers = [*STREAM_HEADERS, *self._id, *self.added]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def write(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_stream(self, data: bytes = b"") -> None:
        """The body's last bytes (if any) and its end, in one message: one write."""
        self.done = True
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def respond(
        self, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.done = True
        headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *self._id]
        headers += self.added
        if extra:
            headers += extra
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})


class UnsupportedEncodingError(RequestError):
    """A compressed body (Content-Encoding): 415 with the one encoding read (RFC 9110
    15.5.16), rather than a parse error about bytes that were never JSON."""

    def __init__(self, encoding: str) -> None:
        super().__init__(
            415,
            f"Content-Encoding {encoding!r} is not supported: send the body uncompressed.",
            INVALID_REQUEST,
            "unsupported_content_encoding",
        )

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"accept-encoding", b"identity")]


def error_headers(exc: RequestError) -> list[tuple[bytes, bytes]]:
    return exc.headers()


def in_dialect(exc: RequestError, path: str) -> RequestError:
    """The error in the shape of the API the path speaks (Anthropic's on /v1/messages)."""
    return anthropic_error(exc) if path in ANTHROPIC_PATHS else exc


async def respond_error(http: AsgiOut | Send, exc: RequestError, path: str = "") -> int:
    """Answer with the error in the path's API's shape; its status."""
    out = http if isinstance(http, AsgiOut) else AsgiOut(http)
    shaped = in_dialect(exc, path)
    await out.respond(shaped.status, shaped.body(), error_headers(exc))
    return shaped.status


async def respond_method_not_allowed(send: Send, method: str, path: str) -> None:
    message = f"{method} is not allowed on {path}; use POST."
    shaped = in_dialect(RequestError(405, message, INVALID_REQUEST, "method_not_allowed"), path)
    await AsgiOut(send).respond(405, shaped.body(), [(b"allow", b"POST")])


class Edge:
    def __init__(
        self,
        app: FastAPI,
        deps: Deps | None,
        max_body_bytes: int,
        access_log: AccessLog | None = None,
        access: Access | None = None,
        admission: Admission | None = None,
        request_timeout: float = 0.0,
    ) -> None:
        self.app = app
        self.deps = deps
        self.max_body_bytes = max_body_bytes
        self.access_log = access_log  # None: --no-access-log
        self.access = access or Access(KeyRing())
        self.admission = admission or Admission()
        self.request_timeout = request_timeout  # seconds; 0: no deadline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        access = self.access
        if path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        server = scope.get("server")
        if access.admin_port is not None and server and server[1] == access.admin_port:
            if is_admin_path(path):
                await self.app(scope, receive, send)
            else:  # the admin listener serves the operator's routes only
                body = error_body(
                    f"{path} is not served on the admin listener.", INVALID_REQUEST, "not_found"
                )
                await AsgiOut(send).respond(404, body)
            return
        key = None
        try:
            if is_client_path(path):
                key = access.client(scope["headers"])
            elif is_admin_path(path):
                access.admin(scope["headers"])
        except AuthenticationError as exc:
            await respond_error(send, exc, path)
            self._refused(GENERATION_PATHS.get(path), 401, exc.code)
            return
        scope[TENANT_SCOPE] = tenant_of(key)  # whose stored objects it may see
        endpoint = GENERATION_PATHS.get(path)
        if endpoint is None:
            local = LOCAL_PATHS.get(path)
            if local is None:
                await self.app(scope, receive, send)
            elif scope["method"] == "POST":
                await self._local(local, scope, receive, send)
            else:
                await respond_method_not_allowed(send, scope["method"], path)
        elif scope["method"] == "POST":
            await self._generate(endpoint, key, scope, receive, send)
        else:  # FastAPI knows no route here and would say 404
            await respond_method_not_allowed(send, scope["method"], path)
            self._refused(endpoint, 405, "method_not_allowed")

    def _refused(self, endpoint: str | None, status: int, code: str) -> None:
        """Count a generation request refused before it was read (a key probe, a wrong
        method): requests_total and errors_total show them like any other answer."""
        if endpoint is not None and self.deps is not None:
            metrics = self.deps.metrics
            metrics.answered(endpoint, "", status)
            metrics.errors.labels("", code).inc()

    def _timeout(self, scope: Scope) -> float:
        """The request's deadline: --request-timeout, or the client's shorter one."""
        server = self.request_timeout
        for name, value in scope["headers"]:
            if name == TIMEOUT_HEADER:
                try:
                    client = float(value) / 1000.0
                except ValueError:
                    client = -1.0
                if not 0 < client < float("inf"):
                    raise RequestError(
                        400,
                        "The request-timeout-ms header must be a positive number of milliseconds.",
                        INVALID_REQUEST,
                        "invalid_value",
                        "request-timeout-ms",
                    )
                return min(server, client) if server else client
        return server

    async def _generate(
        self, endpoint: str, key: bytes | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        received = time.perf_counter()
        deps = self.deps
        assert deps is not None
        path = scope["path"]
        http = AsgiOut(send, anthropic=path in ANTHROPIC_PATHS)
        timeout, bad_timeout = 0.0, None
        try:
            timeout = self._timeout(scope)
        except RequestError as exc:
            bad_timeout = exc
        ctx, refused = _request(
            endpoint, scope, deps, http, received, timeout, tenant=tenant_of(key)
        )
        http.added = ctx.headers
        status = CLIENT_GONE
        ticket = None
        try:
            if refused is not None or bad_timeout is not None:
                raise refused or bad_timeout  # type: ignore[misc]
            ticket = self.admission.enter(key)
            body = await self._body(receive)

            async def answer() -> int:
                assert ticket is not None
                try:
                    await ticket.wait()
                except RequestError as exc:  # the queue timed out, or shutting down
                    ctx.error = exc.code
                    return await respond_error(http, exc, path)
                return await serve(ctx, body)

            status = await _until_client_leaves(answer(), receive, http)
        except ClientGone:
            pass
        except RequestError as exc:
            ctx.error = exc.code
            status = await respond_error(http, exc, path)
        finally:
            if ticket is not None:
                ticket.release()
            _account(deps, ctx, status)
            if self.access_log is not None:
                self.access_log.write("POST", ctx, status)
            ctx.release()

    async def _local(self, endpoint: str, scope: Scope, receive: Receive, send: Send) -> None:
        """An endpoint answered here (local_endpoints): body, answer, access line."""
        deps = self.deps
        assert deps is not None
        path = scope["path"]
        http = AsgiOut(send, anthropic=path in ANTHROPIC_PATHS)
        received = time.perf_counter()
        ctx, refused = _request(
            endpoint, scope, deps, http, received, id_prefix=LOCAL_ID_PREFIX[endpoint]
        )
        status = CLIENT_GONE
        try:
            if refused is not None:
                raise refused
            body = await self._body(receive)
            answer = await LOCAL[endpoint](ctx, body)
            status = 200
            await http.respond(200, answer)
        except ClientGone:
            pass
        except Exception as exc:
            err = as_request_error(exc)
            ctx.error = err.code
            status = await respond_error(http, err, path)
        finally:
            _account(deps, ctx, status)
            if self.access_log is not None:
                self.access_log.write("POST", ctx, status)

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


def _request(
    endpoint: str,
    scope: Scope,
    deps: Deps,
    http: AsgiOut,
    received: float,
    timeout: float = 0.0,
    id_prefix: str | None = None,
    tenant: str = "",
) -> tuple[RequestContext, RequestError | None]:
    """The request's context: its ids (X-Request-Id, else minted with `id_prefix` or the
    endpoint's), session and trace; and the error of a bad header."""
    header = traceparent = session = None
    refused: RequestError | None = None
    for name, value in scope["headers"]:
        if name == request_ids.HEADER:
            header = value
        elif name == b"traceparent":
            traceparent = value
        elif name == _SESSION:
            session = value
        elif name == b"content-encoding" and value.lower() not in (b"identity", b""):
            encoding = bytes(value).decode("latin-1")
            refused = UnsupportedEncodingError(encoding)
    request_id, prefix = "", ""
    if header is not None:
        try:
            request_id, prefix = request_ids.from_header(header)
        except RequestError as exc:
            refused = exc
    if not request_id:
        request_id = request_ids.mint(id_prefix or ID_PREFIX[endpoint])
    http.set_request_id(request_id)
    ctx = new_request(
        deps,
        endpoint,
        http,
        received,
        request_id=request_id,
        engine_prefix=prefix,
        session_id=bytes(session).decode("latin-1") if session else None,
        timeout=timeout,
        path=scope["path"],
        tenant=tenant,
        headers=scope["headers"],
    )
    if deps.tracing is not None:
        carrier = {"traceparent": traceparent.decode("latin-1")} if traceparent else {}
        ctx.trace = deps.tracing.start(
            f"POST {scope['path']}", carrier, {"switchyard.request_id": request_id}
        )
    return ctx, refused


def _account(deps: Deps, ctx: RequestContext, status: int) -> None:
    """Count the request (by model) and end its trace."""
    model = ctx.entry.name if ctx.entry is not None else ""
    metrics = deps.metrics
    metrics.answered(ctx.inp.endpoint, model, status)
    if ctx.error:
        metrics.errors.labels(model, ctx.error).inc()
    if ctx.trace is not None:
        fields = request_fields(ctx, status, deps.instances(), time.perf_counter())
        attributes = {f"switchyard.{k}": v for k, v in fields.items() if v is not None}
        ctx.trace.end(status, ctx.error, attributes)


async def _until_client_leaves(answer: Any, receive: Receive, http: AsgiOut) -> int:
    """Run `answer` (a coroutine returning the status); a client that goes away before the
    answer is complete cancels it (its engine requests are then aborted).

    Once the answer's last byte went out, `receive` returns http.disconnect (ASGI: receive
    after the response was sent), so the watcher ends by itself on its next step: no
    cancellation thrown through it and no wait for it here, per request."""
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
        if not http.done:  # no answer (an error is yet to be sent): stop watching now
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
