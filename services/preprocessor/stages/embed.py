"""POST /v1/embeddings's own stages: tokenize, embed, and its finish (`respond`).

An embedding model is one whose engines report `is_generation` false. Every input is tokenized
as the model's tokenizer does for embeddings (its special tokens added), refused early when it
cannot fit the context; the inputs go to one embedding engine as one EmbedRequest (one reply
with a vector per input), routed as a generation's attempt is (lifecycle.route) and moved to
another engine on a fault as the one migration policy says (migration.py). Vectors come as
float32 bytes: floats for `encoding_format` "float", the same bytes in base64 otherwise
(OpenAI's format).
"""

from __future__ import annotations

import asyncio
import base64
import sys
import time
from array import array

import orjson

from switchyard.common import errors
from switchyard.preprocessor.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_VALUE,
    UNSUPPORTED_VALUE,
    DeadlineExceededError,
    InvalidRequestError,
)
from switchyard.preprocessor.openai_requests import EmbeddingRequest
from switchyard.preprocessor.prompt_encoder import PromptTooLong
from switchyard.preprocessor.stages import lifecycle
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.preprocessor.stages.generation import engine_request_id
from switchyard.preprocessor.stages.migration import Placement, judge
from switchyard.protos.messages import Embeddings, EmbedRequest, GenerateFailed


async def tokenize(ctx: RequestContext) -> None:
    tokenizer = ctx.tokenizer
    req = ctx.request
    assert tokenizer is not None and ctx.entry is not None
    assert isinstance(req, EmbeddingRequest)
    limit = ctx.entry.context_length
    batch = len(req.inputs) > 1
    ctx.param = "input"
    ctx.prompt_ids = []
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
        ctx.prompt_ids.append(ids)


def _too_long(limit: int, tokens: int, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"This model's maximum context length is {limit} tokens, however you requested "
        f"{tokens} tokens in the input. Please reduce the input.",
        CONTEXT_LENGTH_EXCEEDED,
        param,
    )


async def embed(ctx: RequestContext) -> None:
    """The `embed` stage: one EmbedRequest for every input, on one embedding engine, within
    the request's deadline."""
    ctx.active = True
    ctx.deps.metrics.active.inc()
    timeout = ctx.inp.timeout
    if not timeout:
        ctx.extra["embeddings"] = await _attempts(ctx)
        return
    left = timeout - (time.perf_counter() - ctx.inp.received)
    try:
        async with asyncio.timeout(max(0.0, left)):
            ctx.extra["embeddings"] = await _attempts(ctx)
    except TimeoutError:
        raise DeadlineExceededError(timeout) from None


async def _attempts(ctx: RequestContext) -> Embeddings:
    """Route -> dispatch -> one reply, migrated on faults as the migration policy says."""
    deps = ctx.deps
    limits = deps.limits
    placement = Placement()
    while True:
        attempt = placement.attempt
        request_id = engine_request_id(ctx.inp.engine_id, 0, -1, 0, attempt)
        routed = await lifecycle.route(
            ctx, request_id, ctx.prompt_ids[0], placement, attempt=attempt
        )
        assert routed.instance_id is not None
        ctx.extra["instance_id"] = routed.instance_id  # for the access log
        request = EmbedRequest(
            request_id=request_id,
            instance_id=routed.instance_id,
            inputs=ctx.prompt_ids,
            http_request_id=ctx.inp.request_id,
        )
        stream = await lifecycle.open_stream(ctx, request, ctx.queue)
        try:
            async with asyncio.timeout(limits.first_token_timeout):
                reply = await ctx.queue.get()
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
        await judge(ctx, placement, reply)  # raises when the request fails


def _floats(vector: bytes) -> list[float]:
    values = array("f")
    values.frombytes(vector)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


async def respond(ctx: RequestContext) -> None:
    """The embeddings' `finish` stage: the vectors as OpenAI's list."""
    result: Embeddings = ctx.extra["embeddings"]
    req = ctx.request
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
    tokens = sum(len(ids) for ids in ctx.prompt_ids)
    body = {
        "object": "list",
        "data": data,
        "model": req.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    await ctx.inp.http.respond(200, orjson.dumps(body))
    metrics = ctx.deps.metrics
    model = ctx.entry.name if ctx.entry is not None else ""
    metrics.duration.labels(model).observe(time.perf_counter() - ctx.inp.received)
    metrics.input_tokens.inc_labels((model,), tokens)
