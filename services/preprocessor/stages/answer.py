"""The answer's two ends: the sink a request's output goes to, and the `finish` stage.

`sink_for`: a streamed request's SSE frames (chat or completions chunks, the Responses or
the Messages API's events), else one JSON body at the end. `finish`: the usage (the n
choices of a prompt share its cached prefix), the answer's last bytes, and the request's
metrics, with what the KV router predicted of each generation's cached prefix beside what the
engine reported.
"""

from __future__ import annotations

import functools
import time

from switchyard.preprocessor import sse
from switchyard.preprocessor.anthropic_requests import MessagesRequest
from switchyard.preprocessor.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
)
from switchyard.preprocessor.responses_requests import ResponsesRequest
from switchyard.preprocessor.stages import messages, stored
from switchyard.preprocessor.stages.context import CHAT, RequestContext, Sink
from switchyard.preprocessor.stages.responses import (
    Progress,
    ResponseCollectSink,
    ResponseHead,
    ResponseStreamSink,
)
from switchyard.preprocessor.stages.sinks import CollectSink, StreamSink, Usage


def sink_for(ctx: RequestContext) -> Sink:
    inp = ctx.inp
    http = inp.http
    req = ctx.request
    if isinstance(req, ResponsesRequest):
        shown = {**req.shown, **stored.shown(ctx)}
        keep = functools.partial(stored.keep, ctx)
        head = ResponseHead(
            stored.response_id(ctx),
            req.model,
            inp.created,
            shown,
            keep,
            functools.partial(progress, ctx),
        )
        return ResponseStreamSink(http, head) if req.stream else ResponseCollectSink(http, head)
    if isinstance(req, MessagesRequest):
        return messages.sink(ctx)
    assert not isinstance(req, EmbeddingRequest)  # embeddings answer in the embed stages
    chat = inp.endpoint == CHAT
    if req.stream:
        frames = (sse.ChatStream if chat else sse.CompletionStream)(
            inp.request_id, req.model, inp.created
        )
        return StreamSink(http, frames, chat, req.include_usage)
    return CollectSink(http, inp.request_id, req.model, inp.created, chat)


def usage_of(ctx: RequestContext) -> Usage:
    """The request's usage so far (the n choices of a prompt share its cached prefix)."""
    prompt = completion = reasoning = 0
    for ids in ctx.prompt_ids:
        prompt += len(ids)
    cached: dict[int, int] = {}
    for choice in ctx.choices:
        completion += len(choice.generated)
        reasoning += choice.reasoning_tokens
        cached[choice.group] = max(cached.get(choice.group, 0), choice.cached_tokens)
    return Usage(prompt, completion, sum(cached.values()), reasoning)


def progress(ctx: RequestContext) -> Progress:
    """What a response that fails has so far: its choices, usage, and whether an engine
    took it (a generation was routed to one)."""
    dispatched = any(g.attempt is not None and g.attempt.instance_id for g in ctx.generations)
    return ctx.choices, usage_of(ctx), dispatched


async def finish(ctx: RequestContext) -> None:
    sink = ctx.sink
    assert sink is not None
    req = ctx.request
    usage = usage_of(ctx)
    if isinstance(sink, CollectSink):
        if isinstance(req, CompletionRequest) and req.best_of > req.sampling.n:
            sink.keep = req.sampling.n
        # Asked for by the client (best_of asks the engine for them to rank its candidates).
        if isinstance(req, ChatCompletionRequest):
            shown = req.logprobs
        else:
            shown = isinstance(req, CompletionRequest) and req.logprobs is not None
        await sink.end(ctx.choices, usage, shown)
    else:
        await sink.end(ctx.choices, usage)
    ctx.usage = usage
    model = ctx.entry.name if ctx.entry is not None else ""
    ctx.deps.metrics.finished(
        model, time.perf_counter() - ctx.inp.received, usage, _predictions(ctx)
    )


def _predictions(ctx: RequestContext) -> list[tuple[int, int, int, int]]:
    """(predicted, engine-reported cached tokens, block size, prompt tokens) per generation
    that the KV router placed (other policies predict nothing)."""
    out = []
    for gen in ctx.generations:
        att = gen.attempt
        if att is None or att.predicted is None:
            continue
        predicted, block_size = att.predicted
        reported = max((c.cached_tokens for c in gen.choices), default=0)
        out.append((predicted, reported, block_size, len(gen.prompt_ids)))
    return out
