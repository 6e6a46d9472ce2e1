"""Each endpoint's stages, in order, built in this one place, and `serve`, which runs them.

    chat:         parse, model, template, tokenize, check, generate, stream, finish
    completions:  parse, model,           tokenize, check, generate, stream, finish

`generate` routes and dispatches each choice (route -> prefill hop -> dispatch, see
generation.py); `stream` is the token loop, around which migration re-runs route -> dispatch
for a failed attempt. Every failure becomes an OpenAI-shaped error here: an HTTP status before
the first byte of the answer, an error event inside a stream after it.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from switchyard.preprocessor import sse
from switchyard.preprocessor.errors import as_request_error
from switchyard.preprocessor.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_chat_completion,
    parse_completion,
)
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import (
    CHAT,
    COMPLETIONS,
    Deps,
    RequestContext,
    RequestInput,
)
from switchyard.preprocessor.stages.generation import Generation
from switchyard.preprocessor.stages.prompt import check, render_template, resolve_model, tokenize
from switchyard.preprocessor.stages.sinks import CollectSink, HttpOut, StreamSink, Usage
from switchyard.preprocessor.stages.token_loop import stream


class Stage(NamedTuple):
    name: str
    run: Callable[[RequestContext], Awaitable[None] | None]


PARSE: dict[str, Callable[[bytes], ChatCompletionRequest | CompletionRequest]] = {
    CHAT: parse_chat_completion,
    COMPLETIONS: parse_completion,
}
ID_PREFIX = {CHAT: "chatcmpl", COMPLETIONS: "cmpl"}
PROMPT_STAGES: dict[str, tuple[Stage, ...]] = {
    CHAT: (
        Stage("model", resolve_model),
        Stage("template", render_template),
        Stage("tokenize", tokenize),
        Stage("check", check),
    ),
    COMPLETIONS: (
        Stage("model", resolve_model),
        Stage("tokenize", tokenize),
        Stage("check", check),
    ),
}


async def run_stages(ctx: RequestContext, stages: tuple[Stage, ...]) -> None:
    timer = ctx.deps.timer
    for stage in stages:
        t0 = time.perf_counter()
        result = stage.run(ctx)
        if inspect.isawaitable(result):
            await result
        if timer is not None and stage.name != "model":
            timer.add(stage.name, time.perf_counter() - t0)


def parse(deps: Deps, endpoint: str, body: bytes, received: float) -> RequestContext:
    t0 = time.perf_counter()
    request = PARSE[endpoint](body)
    if deps.timer is not None:
        deps.timer.add("parse", time.perf_counter() - t0)
    request_id = f"{ID_PREFIX[endpoint]}-{uuid.uuid4().hex}"
    return RequestContext(
        RequestInput(endpoint, request_id, request, received, int(time.time())), deps
    )


async def generate(ctx: RequestContext) -> None:
    """Start every choice's first attempt."""
    state = ctx.state
    assert state.tokenizer is not None and state.sampling is not None
    choice = ChoiceOutput(0, state.tokenizer, state.prompt_ids, ctx.inp.request.sampling.stop)
    gen = Generation(ctx, choice, ctx.inp.request_id, state.sampling)
    state.choices.append(choice)
    state.generations.append(gen)
    state.unfinished = 1
    await gen.start()


def sink_for(ctx: RequestContext, http: HttpOut) -> StreamSink | CollectSink:
    inp = ctx.inp
    req = inp.request
    chat = inp.endpoint == CHAT
    if req.stream:
        frames = (sse.ChatStream if chat else sse.CompletionStream)(
            inp.request_id, req.model, inp.created
        )
        return StreamSink(http, frames, chat, req.include_usage)
    return CollectSink(http, inp.request_id, req.model, inp.created, chat)


async def finish(ctx: RequestContext, sink: StreamSink | CollectSink) -> None:
    t0 = time.perf_counter()
    state = ctx.state
    completion = sum(len(g.generated) for g in state.generations)
    cached = max((c.cached_tokens for c in state.choices), default=0)
    usage = Usage(len(state.prompt_ids), completion, cached)
    await sink.end(state.choices, usage)
    metrics = ctx.deps.metrics
    metrics.duration.observe(time.perf_counter() - ctx.inp.received)
    metrics.input_tokens.inc(usage.prompt_tokens)
    metrics.output_tokens.inc(usage.completion_tokens)
    metrics.cached_tokens.inc(usage.cached_tokens)
    if ctx.deps.timer is not None:
        ctx.deps.timer.add("finish", time.perf_counter() - t0)


async def serve(deps: Deps, endpoint: str, body: bytes, received: float, http: HttpOut) -> int:
    """Answer one generation request on `http`; returns the HTTP status (200 once a stream
    started, whatever happened in it)."""
    ctx: RequestContext | None = None
    sink: StreamSink | CollectSink | None = None
    try:
        ctx = parse(deps, endpoint, body, received)
        await run_stages(ctx, PROMPT_STAGES[endpoint])
        await generate(ctx)
        sink = sink_for(ctx, http)
        deps.metrics.active.inc()
        try:
            await stream(ctx, sink)
            await finish(ctx, sink)
        finally:
            deps.metrics.active.dec()
        return 200
    except Exception as exc:
        err = as_request_error(exc)
        if sink is not None and await sink.fail(err):
            return 200
        await http.respond(err.status, err.body())
        return err.status
    finally:
        if ctx is not None:
            for gen in ctx.state.generations:
                await gen.stop()
