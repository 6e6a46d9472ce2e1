"""POST /v1/embeddings as stages: parse, model, tokenize, check, embed, finish.

An embedding model is one whose engines report `is_generation` false. Every input is tokenized
as the model's tokenizer does for embeddings (its special tokens added), refused early when it
cannot fit the context; the inputs go to one embedding engine as one EmbedRequest (one reply
with a vector per input), retried on another engine when that one fails with a migratable
fault. Vectors come as float32 bytes: floats for `encoding_format` "float", the same bytes in
base64 otherwise (OpenAI's format).
"""

from __future__ import annotations

import asyncio
import base64
import sys
import time
from array import array

import orjson

from switchyard.common import errors
from switchyard.common.errors import EngineError
from switchyard.preprocessor.dispatcher_client import NoDispatcher
from switchyard.preprocessor.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_VALUE,
    UNSUPPORTED_VALUE,
    InvalidRequestError,
    NoWorker,
)
from switchyard.preprocessor.openai_requests import EmbeddingRequest
from switchyard.preprocessor.prompt_encoder import PromptTooLong
from switchyard.preprocessor.router_client import route_around
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.preprocessor.stages.sinks import HttpOut
from switchyard.protos.messages import Embeddings, EmbedRequest, GenerateFailed, RouteRequest


async def tokenize(ctx: RequestContext) -> None:
    state = ctx.state
    tokenizer = state.tokenizer
    req = ctx.inp.request
    assert tokenizer is not None and state.entry is not None
    assert isinstance(req, EmbeddingRequest)
    limit = state.entry.context_length
    batch = len(req.inputs) > 1
    state.param = "input"
    state.prompt_ids = []
    for i, item in enumerate(req.inputs):
        param = f"input[{i}]" if batch else "input"
        if isinstance(item, str):
            try:
                tokenizer.prompts.check_bytes(item, limit)
            except PromptTooLong as exc:
                raise _too_long(limit, exc.tokens, param) from None
            ids = await tokenizer.encode_async(
                item, add_special_tokens=True, offload_chars=ctx.deps.limits.offload_chars
            )
        else:
            ids = list(item)
            if max(ids) >= tokenizer.vocab_size:
                raise InvalidRequestError(
                    f"Token ids must be below the vocabulary size {tokenizer.vocab_size}.",
                    INVALID_VALUE,
                    param,
                )
        if not ids:
            raise InvalidRequestError("An input is empty.", INVALID_VALUE, param)
        if len(ids) > limit:
            raise _too_long(limit, len(ids), param)
        state.prompt_ids.append(ids)


def _too_long(limit: int, tokens: int, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"This model's maximum context length is {limit} tokens, however you requested "
        f"{tokens} tokens in the input. Please reduce the input.",
        CONTEXT_LENGTH_EXCEEDED,
        param,
    )


async def embed(ctx: RequestContext) -> Embeddings:
    """One EmbedRequest for every input, on one embedding engine; migrated on faults."""
    deps = ctx.deps
    state = ctx.state
    limits = deps.limits
    exclude: list[int] = []
    refused: list[int] = []  # as Generation.refused: avoided while another engine is left
    failure: GenerateFailed | None = None
    for attempt in range(limits.migration_limit + 1):
        engine_id = ctx.inp.engine_id
        request_id = engine_id if attempt == 0 else f"{engine_id}.m{attempt}"
        route = RouteRequest(
            request_id=request_id,
            model=ctx.inp.request.model,
            token_ids=state.prompt_ids[0],
            exclude=exclude,
        )
        routed = await route_around(deps.router, route, limits.route_timeout, refused)
        if routed.instance_id is None:
            model = ctx.inp.request.model
            raise NoWorker(routed.error, f"no engine available for model {model!r}", model)
        state.extra["instance_id"] = routed.instance_id  # for the access log
        request = EmbedRequest(
            request_id=request_id,
            instance_id=routed.instance_id,
            inputs=state.prompt_ids,
            http_request_id=ctx.inp.request_id,
        )
        try:
            stream = await deps.dispatcher.open(request, state.queue)
        except NoDispatcher as exc:
            raise NoWorker("no_dispatcher", str(exc)) from None
        try:
            async with asyncio.timeout(limits.first_token_timeout):
                reply = await state.queue.get()
        except TimeoutError:
            await stream.cancel()
            reply = GenerateFailed(
                request_id=request_id,
                instance_id=routed.instance_id,
                kind=errors.DISCONNECTED,
                message=f"no reply for {limits.first_token_timeout:g}s",
            )
        else:
            stream.close()
        finally:
            await deps.router.progress(request_id, routed.instance_id, "finished", final=True)
        if type(reply) is Embeddings:
            return reply
        assert type(reply) is GenerateFailed
        failure = reply
        if failure.kind not in errors.MIGRATABLE:
            raise EngineError(failure.kind, failure.message, failure.instance_id)
        if failure.kind == errors.OVERLOADED:
            await deps.router.busy(failure.instance_id, limits.busy_seconds)
        if failure.kind == errors.REFUSED:
            refused.append(failure.instance_id)
        elif failure.engine_fault:
            exclude.append(failure.instance_id)
        entry = state.entry
        deps.metrics.migrations.labels(entry.name if entry else "", failure.kind).inc()
    assert failure is not None
    raise EngineError(
        failure.kind,
        f"gave up after {limits.migration_limit} retries: {failure.message}",
        failure.instance_id,
    )


def _floats(vector: bytes) -> list[float]:
    values = array("f")
    values.frombytes(vector)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


async def respond(ctx: RequestContext, result: Embeddings, http: HttpOut) -> None:
    t0 = time.perf_counter()
    req = ctx.inp.request
    assert isinstance(req, EmbeddingRequest)
    if req.dimensions is not None and req.dimensions != result.dimensions:
        raise InvalidRequestError(
            f"'dimensions' must be {result.dimensions} for model {req.model!r}: its engines "
            "return embeddings of that size and cannot shorten them.",
            UNSUPPORTED_VALUE,
            "dimensions",
        )
    if req.base64:
        data = [
            {"object": "embedding", "index": i, "embedding": base64.b64encode(v).decode()}
            for i, v in enumerate(result.vectors)
        ]
    else:
        data = [
            {"object": "embedding", "index": i, "embedding": _floats(v)}
            for i, v in enumerate(result.vectors)
        ]
    tokens = sum(len(ids) for ids in ctx.state.prompt_ids)
    body = {
        "object": "list",
        "data": data,
        "model": req.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    await http.respond(200, orjson.dumps(body))
    metrics = ctx.deps.metrics
    model = ctx.state.entry.name if ctx.state.entry is not None else ""
    metrics.duration.labels(model).observe(time.perf_counter() - ctx.inp.received)
    metrics.input_tokens.labels(model).inc(tokens)
    if ctx.deps.timer is not None:
        ctx.deps.timer.add("finish", time.perf_counter() - t0)
