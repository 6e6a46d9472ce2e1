"""The OpenAI HTTP edge: FastAPI routes, error bodies, streaming.

Request bodies are read raw and validated by openai_requests (no pydantic on the request
path); responses are pre-encoded bytes from sse. Errors become OpenAI-shaped bodies here and
only here.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from switchyard.common import errors as kinds
from switchyard.common.errors import EngineError
from switchyard.preprocessor import sse
from switchyard.preprocessor.catalog import ModelEntry
from switchyard.preprocessor.errors import (
    INVALID_REQUEST,
    ModelNotFoundError,
    RequestError,
    ServiceUnavailableError,
    error_body,
)
from switchyard.preprocessor.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingOptions,
    check_context,
    parse_chat_completion,
    parse_completion,
)
from switchyard.preprocessor.pipeline import GenerationInput, NoWorker
from switchyard.preprocessor.state import PreprocessorState
from switchyard.preprocessor.text_stream import Outcome, text_deltas
from switchyard.protos.messages import RouteRequest, SamplingParams

log = logging.getLogger(__name__)

JSON = "application/json"
SESSION_HEADER = "x-session-id"  # the router's session key (else the body's `user`)
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True, slots=True)
class EventStream:
    """A streamed answer (status 200, text/event-stream): its SSE frames, each one write."""

    frames: AsyncIterator[bytes]
    status_code: int = 200


async def generation(
    state: PreprocessorState,
    body: bytes,
    chat: bool,
    started: float,
    session_id: str | None = None,
) -> Response | EventStream:
    """POST /v1/chat/completions (chat) or /v1/completions: the answer to `body`, with
    every failure turned into an OpenAI-shaped error response, and the request counted.
    `session_id`: the x-session-id header (else the body's `user` is the session key)."""
    try:
        req = parse_chat_completion(body) if chat else parse_completion(body)
        session = session_id or req.user
        answer = await _serve(state, req, "chatcmpl" if chat else "cmpl", started, session)
    except Exception as exc:
        answer = _error(_request_error(exc))
    endpoint = "chat_completions" if chat else "completions"
    state.metrics.requests.labels(endpoint, str(answer.status_code)).inc()
    return answer


def _json(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type=JSON)


def _error(exc: RequestError) -> Response:
    return _json(exc.body(), exc.status)


def _request_error(exc: BaseException) -> RequestError:
    """Pipeline failures -> the client-facing error."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, NoWorker):
        if exc.reason == "unknown_model":
            return ModelNotFoundError(exc.model)
        if exc.reason == "all_busy":
            return ServiceUnavailableError(
                f"Every engine serving {exc.model!r} is overloaded; retry later.", "overloaded"
            )
        return ServiceUnavailableError(str(exc))
    if isinstance(exc, EngineError):
        if exc.kind == kinds.BAD_REQUEST:
            return RequestError(
                400,
                f"The engine rejected the request: {exc.message}",
                INVALID_REQUEST,
                "engine_rejected",
            )
        if exc.kind in kinds.MIGRATABLE:
            return ServiceUnavailableError(
                f"No engine could serve the request: {exc.message}", "engine_unavailable"
            )
        return RequestError(
            500, f"The engine failed: {exc.message}", "server_error", "engine_error"
        )
    log.exception("unexpected failure", exc_info=exc)
    return RequestError(500, "Internal error", "server_error", "internal_error")


def _sampling(opts: SamplingOptions, max_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=-1 if opts.top_k is None else opts.top_k,
        min_tokens=min(opts.min_tokens, max_tokens),
        repetition_penalty=opts.repetition_penalty,
        presence_penalty=opts.presence_penalty,
        frequency_penalty=opts.frequency_penalty,
        seed=opts.seed,
        ignore_eos=opts.ignore_eos,
    )


def create_app(state: PreprocessorState) -> FastAPI:
    app = FastAPI(title="Switchyard", lifespan=state.lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = "not_found" if exc.status_code == 404 else "http_error"
        return _json(error_body(str(exc.detail), INVALID_REQUEST, code), exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        return _error(_request_error(exc))

    @app.get("/health")
    async def health() -> Response:
        return _json(b'{"status":"ok"}')

    @app.get("/ready")
    async def ready() -> Response:
        missing = state.not_ready_reason()
        if missing:
            return _json(error_body(missing, "service_unavailable", "not_ready"), 503)
        return _json(b'{"status":"ready"}')

    @app.get("/v1/models")
    async def models() -> Response:
        return _json(state.models_body())

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def handle(request: Request, chat: bool) -> Response:
        # Normally served by fast_path in front of this app; these routes answer the same
        # for an app mounted without it.
        started = time.perf_counter()
        session = request.headers.get(SESSION_HEADER)
        answer = await generation(state, await request.body(), chat, started, session)
        if isinstance(answer, EventStream):
            return StreamingResponse(
                answer.frames, media_type="text/event-stream", headers=STREAM_HEADERS
            )
        return answer

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    @app.post("/debug/route")
    async def debug_route(request: Request) -> Response:
        session = request.headers.get(SESSION_HEADER)
        return await _debug_route(state, await request.body(), session)

    return app


async def _prompt(
    state: PreprocessorState, req: ChatCompletionRequest | CompletionRequest
) -> tuple[ModelEntry, list[int], str]:
    """The model entry, the prompt's token ids and the request field they came from."""
    entry = state.catalog.get(req.model)
    if entry is None:
        if not state.catalog:
            raise ServiceUnavailableError("No engine is available: none is routable right now.")
        raise ModelNotFoundError(req.model)
    tokenizer = state.require_tokenizer(req.model)
    offload = state.config.tokenize_offload_chars
    if isinstance(req, ChatCompletionRequest):
        text = tokenizer.chat_template.render(req.messages)
        prompt_ids = await tokenizer.encode_async(text, offload_chars=offload)
        param = "messages"
    elif isinstance(req.prompt, str):
        prompt_ids = await tokenizer.encode_async(req.prompt, offload_chars=offload)
        param = "prompt"
    else:
        prompt_ids = list(req.prompt)
        param = "prompt"
        if max(prompt_ids, default=0) >= tokenizer.vocab_size:
            raise RequestError(
                400,
                f"Token ids must be below the vocabulary size {tokenizer.vocab_size}.",
                INVALID_REQUEST,
                "invalid_value",
                param,
            )
    if not prompt_ids:
        raise RequestError(400, "The prompt is empty.", INVALID_REQUEST, "invalid_value", param)
    return entry, prompt_ids, param


async def _debug_route(
    state: PreprocessorState, body: bytes, session_id: str | None = None
) -> Response:
    """Where would this request go, and why? Decided by the router, sent to no engine."""
    req: ChatCompletionRequest | CompletionRequest
    try:
        is_chat = b'"messages"' in body
        req = parse_chat_completion(body) if is_chat else parse_completion(body)
    except RequestError as exc:
        return _error(exc)
    try:
        _entry, prompt_ids, _param = await _prompt(state, req)
        request_id = f"route-{uuid.uuid4().hex}"
        reply = await state.router.route(
            RouteRequest(
                request_id=request_id,
                model=req.model,
                token_ids=prompt_ids,
                dry_run=True,
                session_id=session_id or req.user,
            ),
            state.config.route_timeout,
        )
    except RequestError as exc:
        return _error(exc)
    if reply.instance_id is None:
        return _error(
            _request_error(NoWorker(reply.error, f"no engine for {req.model!r}", req.model))
        )
    workers = sorted(reply.workers, key=lambda w: (w.cost, w.instance_id))
    chosen_instance = state.fleet.instances.get(reply.instance_id)
    return _json(
        orjson.dumps(
            {
                "policy": reply.policy,
                "prompt_tokens": len(prompt_ids),
                "prompt_blocks": reply.prompt_blocks,
                "chosen": {
                    "instance_id": reply.instance_id,
                    "url": chosen_instance.url if chosen_instance else None,
                    "dp_rank": reply.dp_rank,
                    "predicted_ttft_ms": reply.predicted_ttft_ms,
                },
                "prefill": _instance_ref(state, reply.prefill_instance_id),
                "workers": [msgspec.structs.asdict(w) for w in workers],
            }
        )
    )


def _instance_ref(state: PreprocessorState, instance_id: int | None) -> dict | None:
    if instance_id is None:
        return None
    instance = state.fleet.instances.get(instance_id)
    return {"instance_id": instance_id, "url": instance.url if instance else None}


async def _serve(
    state: PreprocessorState,
    req: ChatCompletionRequest | CompletionRequest,
    prefix: str,
    started: float,
    session_id: str | None = None,
) -> Response | EventStream:
    entry, prompt_ids, param = await _prompt(state, req)
    tokenizer = state.require_tokenizer(req.model)
    max_tokens = check_context(
        len(prompt_ids), req.sampling.max_tokens, entry.context_length, param
    )
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    inp = GenerationInput(
        request_id, req.model, prompt_ids, _sampling(req.sampling, max_tokens), session_id
    )
    tokens = state.metrics.observe(state.pipeline.generate(inp), started)
    texts = text_deltas(tokens, tokenizer, prompt_ids, req.sampling.stop)
    created = int(time.time())
    chat = isinstance(req, ChatCompletionRequest)
    if not req.stream:
        return await _collect(texts, request_id, req.model, created, chat)
    # Wait for the first event before answering, so failures before the first token still
    # get a proper HTTP status instead of an error inside a 200 stream.
    try:
        first = await anext(texts)
    except BaseException as exc:
        await texts.aclose()
        raise _request_error(exc) from None
    frames = (
        sse.ChatStream(request_id, req.model, created)
        if chat
        else sse.CompletionStream(request_id, req.model, created)
    )
    return EventStream(_stream(texts, first, frames, chat, req.include_usage))


async def _collect(
    texts: AsyncIterator[str | Outcome], request_id: str, model: str, created: int, chat: bool
) -> Response:
    parts: list[str] = []
    try:
        async for item in texts:
            if type(item) is str:
                parts.append(item)
            else:
                outcome = item
    except Exception as exc:
        raise _request_error(exc) from None
    build = sse.chat_completion_body if chat else sse.text_completion_body
    return _json(
        build(
            request_id,
            model,
            created,
            "".join(parts),
            outcome.finish_reason,
            outcome.prompt_tokens,
            outcome.completion_tokens,
            outcome.cached_tokens,
        )
    )


async def _stream(
    texts: AsyncIterator[str | Outcome],
    first: str | Outcome,
    frames: sse.ChatStream | sse.CompletionStream,
    chat: bool,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """The SSE body. Every yield is one write to the client, so frames that are ready together
    go out together: the role chunk with the first content, and finish, usage and [DONE]."""
    item = first
    tail = b""
    try:
        if type(item) is str:
            head = frames.first() if chat else b""  # type: ignore[union-attr]
            yield head + frames.delta(item)
            while type(item := await anext(texts)) is str:
                yield frames.delta(item)  # type: ignore[arg-type]
        elif chat:
            tail = frames.first()  # type: ignore[union-attr]
        outcome: Outcome = item  # type: ignore[assignment]
        tail += frames.finish(outcome.finish_reason)
        if include_usage:
            tail += frames.usage(
                outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens
            )
    except Exception as exc:
        err = _request_error(exc)
        tail += sse.sse_error(err.message, err.type, err.code, err.param)
    finally:
        await texts.aclose()
    yield tail + sse.DONE
