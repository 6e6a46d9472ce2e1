"""Each endpoint's stages, in order, built in this one place, and `serve`, which runs them.

    chat:         parse, model, template, outputs, tokenize, check, generate, stream, finish
    responses:    parse, model, template, outputs, tokenize, check, generate, stream, finish
    completions:  parse, model,                    tokenize, check, generate, stream, finish
    embeddings:   parse, model,                    tokenize,        embed,           finish

`outputs` sets up the output parsers and tool_choice's constraint; `generate` routes and
dispatches each prompt's choices (route -> prefill hop -> dispatch, see generation.py);
`stream` is the token loop, around which migration re-runs route -> dispatch for a failed
attempt. The Responses API is chat's stages with its own parse (its request as the chat
request it amounts to, responses_requests) and its own sinks (responses.py), its errors
renamed to its fields. Every failure becomes an OpenAI-shaped error here: an HTTP status
before the first byte of the answer, an error event inside a stream after it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from switchyard.preprocessor import sse
from switchyard.preprocessor.errors import (
    ENGINE_REJECTED,
    DeadlineExceededError,
    as_request_error,
)
from switchyard.preprocessor.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    parse_chat_completion,
    parse_completion,
    parse_embeddings,
)
from switchyard.preprocessor.responses_requests import (
    ResponsesRequest,
    parse_responses,
    responses_error,
)
from switchyard.preprocessor.stages import embed as embed_stages
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    RESPONSES,
    Deps,
    Exchange,
    RequestContext,
    RequestInput,
)
from switchyard.preprocessor.stages.generation import CannotResume, Generation
from switchyard.preprocessor.stages.logprobs import CompletionLogprobs
from switchyard.preprocessor.stages.prompt import (
    check,
    outputs,
    render_template,
    resolve_model,
    tokenize,
)
from switchyard.preprocessor.stages.responses import (
    ResponseCollectSink,
    ResponseHead,
    ResponseStreamSink,
)
from switchyard.preprocessor.stages.sinks import CollectSink, HttpOut, Sink, StreamSink, Usage
from switchyard.preprocessor.stages.token_loop import stream

log = logging.getLogger(__name__)


class Stage(NamedTuple):
    name: str
    run: Callable[[RequestContext], Awaitable[None] | None]


PARSE: dict[
    str, Callable[[bytes], ChatCompletionRequest | CompletionRequest | EmbeddingRequest]
] = {
    CHAT: parse_chat_completion,
    COMPLETIONS: parse_completion,
    EMBEDDINGS: parse_embeddings,
    RESPONSES: parse_responses,
}
ID_PREFIX = {CHAT: "chatcmpl-", COMPLETIONS: "cmpl-", EMBEDDINGS: "embd-", RESPONSES: "resp_"}
PROMPT_STAGES: dict[str, tuple[Stage, ...]] = {
    CHAT: (
        Stage("model", resolve_model),
        Stage("template", render_template),
        Stage("outputs", outputs),
        Stage("tokenize", tokenize),
        Stage("check", check),
    ),
    COMPLETIONS: (
        Stage("model", resolve_model),
        Stage("tokenize", tokenize),
        Stage("check", check),
    ),
    EMBEDDINGS: (
        Stage("model", resolve_model),
        Stage("tokenize", embed_stages.tokenize),
    ),
}
PROMPT_STAGES[RESPONSES] = PROMPT_STAGES[CHAT]


# The prompt stages worth a span of their own (the others take microseconds; a span costs
# tens of microseconds of Python, and its export more: bench/operability.py).
TRACED_STAGES = frozenset({"template", "tokenize"})


async def run_stages(ctx: RequestContext, stages: tuple[Stage, ...]) -> None:
    timer = ctx.deps.timer
    trace = ctx.state.trace
    for stage in stages:
        t0 = time.perf_counter()
        span = None
        if trace is not None and stage.name in TRACED_STAGES:
            span = trace.span(stage.name)
        result = stage.run(ctx)
        if inspect.isawaitable(result):
            await result
        if span is not None:
            span.end()
        if timer is not None:
            timer.add(stage.name, time.perf_counter() - t0)


def parse(
    deps: Deps,
    endpoint: str,
    body: bytes,
    received: float,
    exchange: Exchange | None = None,
    timeout: float = 0.0,
) -> RequestContext:
    """The request body -> a context; its ids and session key (the x-session-id header, else
    the body's `user`) come from the edge (X-Request-Id or minted). `timeout`: the request's
    deadline, seconds after `received` (0: none)."""
    t0 = time.perf_counter()
    request = PARSE[endpoint](body)
    if deps.timer is not None:
        deps.timer.add("parse", time.perf_counter() - t0)
    if exchange is not None:
        request_id, prefix = exchange.request_id, exchange.engine_prefix
        session = exchange.session_id or request.user
    else:
        request_id, prefix = f"{ID_PREFIX[endpoint]}{uuid.uuid4().hex}", ""
        session = request.user
    ctx = RequestContext(
        RequestInput(
            endpoint,
            request_id,
            request,
            received,
            int(time.time()),
            engine_prefix=prefix,
            session_id=session,
            timeout=timeout,
        ),
        deps,
    )
    if exchange is not None:
        exchange.ctx = ctx
        ctx.state.trace = exchange.trace
    return ctx


async def generate(ctx: RequestContext, over: CannotResume | None = None) -> None:
    """Start each prompt's choices: one engine request per prompt, with `n` (or best_of).
    `over`: the request starts over (nothing of it was sent), avoiding the engines that
    failed it, its attempts counted on."""
    state = ctx.state
    tokenizer = state.tokenizer
    assert tokenizer is not None and state.sampling is not None
    req = ctx.inp.request
    chat = isinstance(req, ChatCompletionRequest)
    per_prompt = req.sampling.n if chat else req.best_of  # type: ignore[union-attr]
    index = 0
    for group, prompt_ids in enumerate(state.prompt_ids):
        choices = []
        for _ in range(per_prompt):
            parser = None
            skip = req.sampling.skip_special_tokens
            lp = echo = None
            if chat:
                parser = _parser(ctx)
                if parser is not None and state.parsers is not None:
                    skip = skip and not state.parsers.needs_special_tokens
            else:
                if state.logprobs is not None:
                    lp = CompletionLogprobs(tokenizer.token_texts, state.logprobs)
                if req.echo:  # type: ignore[union-attr]
                    text = state.prompt_texts[group]
                    echo = text if text is not None else tokenizer.decode(prompt_ids)
            choices.append(
                ChoiceOutput(
                    index,
                    tokenizer,
                    prompt_ids,
                    req.sampling.stop,
                    parser,
                    skip,
                    lp,
                    echo or "",
                    group,
                )
            )
            index += 1
        engine_id = ctx.inp.engine_id
        base_id = engine_id if group == 0 else f"{engine_id}.p{group}"
        echo_logprobs = None
        if not chat and req.echo and state.logprobs is not None:  # type: ignore[union-attr]
            echo_logprobs = state.logprobs
        state.choices.extend(choices)
        gen = Generation(ctx, choices, prompt_ids, base_id, state.sampling, echo_logprobs)
        if over is not None:
            gen.base_id = f"{base_id}.s{over.attempt}"  # its attempts' ids are new ones
            gen.attempt_id = gen.base_id
            gen.exclude = list(over.exclude)
            gen.attempt = over.attempt
        state.generations.append(gen)
    state.unfinished = len(state.choices)
    for gen in list(state.generations):  # a start may add generations (split choices)
        await gen.start()


def _parser(ctx: RequestContext):  # type: ignore[no-untyped-def]
    """A choice's output parser (None when it would parse nothing)."""
    req = ctx.inp.request
    assert isinstance(req, ChatCompletionRequest)
    choice = ctx.state.parsers
    if choice is None:
        return None
    parser = choice.for_request(
        prompt=ctx.state.prompt_texts[0] or "",
        tools=req.tools or None,
        tool_choice=req.tool_choice,
        parallel_tool_calls=req.parallel_tool_calls,
        chat_template_kwargs=req.template_kwargs or None,
        strict=not req.stream,
    )
    if not req.separate_reasoning:
        parser.reasoning = None  # SGLang's switch: the thinking stays in the content
    if parser.reasoning is None and parser.tools is None:
        return None
    return parser


def sink_for(ctx: RequestContext, http: HttpOut) -> Sink:
    inp = ctx.inp
    req = inp.request
    if isinstance(req, ResponsesRequest):
        head = ResponseHead(inp.request_id, req.model, inp.created, req.shown)
        return ResponseStreamSink(http, head) if req.stream else ResponseCollectSink(http, head)
    assert not isinstance(req, EmbeddingRequest)  # embeddings take the embed stage
    chat = inp.endpoint == CHAT
    if req.stream:
        frames = (sse.ChatStream if chat else sse.CompletionStream)(
            inp.request_id, req.model, inp.created
        )
        return StreamSink(http, frames, chat, req.include_usage)
    return CollectSink(http, inp.request_id, req.model, inp.created, chat)


async def finish(ctx: RequestContext, sink: Sink) -> None:
    t0 = time.perf_counter()
    state = ctx.state
    req = ctx.inp.request
    completion = sum(len(c.generated) for c in state.choices)
    cached: dict[int, int] = {}
    for choice in state.choices:  # the n choices of a prompt share its cached prefix
        cached[choice.group] = max(cached.get(choice.group, 0), choice.cached_tokens)
    usage = Usage(
        sum(len(ids) for ids in state.prompt_ids),
        completion,
        sum(cached.values()),
        sum(c.reasoning_tokens for c in state.choices),
    )
    if isinstance(sink, CollectSink):
        if isinstance(req, CompletionRequest) and req.best_of > req.sampling.n:
            sink.keep = req.sampling.n
        # Asked for by the client (best_of asks the engine for them to rank its candidates).
        if isinstance(req, ChatCompletionRequest):
            shown = req.logprobs
        else:
            shown = isinstance(req, CompletionRequest) and req.logprobs is not None
        await sink.end(state.choices, usage, shown)
    else:
        await sink.end(state.choices, usage)
    state.usage = usage
    model = state.entry.name if state.entry is not None else ""
    ctx.deps.metrics.finished(
        model, time.perf_counter() - ctx.inp.received, usage, _predictions(ctx)
    )
    if ctx.deps.timer is not None:
        ctx.deps.timer.add("finish", time.perf_counter() - t0)


def _predictions(ctx: RequestContext) -> list[tuple[int, int, int, int]]:
    """(predicted, engine-reported cached tokens, block size, prompt tokens) per generation
    that the KV router placed (other policies predict nothing)."""
    out = []
    for gen in ctx.state.generations:
        if gen.predicted is None:
            continue
        predicted, block_size = gen.predicted
        reported = max((c.cached_tokens for c in gen.choices), default=0)
        out.append((predicted, reported, block_size, len(gen.prompt_ids)))
    return out


def _constraint_field(ctx: RequestContext) -> str | None:
    """The field whose constraint the engine was sent, if any: everything else an engine
    could refuse is checked before it is sent, so its refusal is of the grammar it had to
    compile (a schema feature it lacks, an invalid regex)."""
    if ctx.state.extra.get("constraint") is not None:
        return "tools"  # tool_choice's schema, built from the tools' parameters
    sampling = getattr(ctx.inp.request, "sampling", None)
    if sampling is not None and sampling.constraint is not None:
        return sampling.constraint_param or None
    return None


async def _start_over(ctx: RequestContext, over: CannotResume) -> None:
    """The request from the prompt again, its output so far dropped (the client has none of
    it): what a sampled constrained output does when its engine fails."""
    state = ctx.state
    for gen in state.generations:
        await gen.stop()
    log.warning(
        "starting request_id=%s over from the prompt: %s",
        ctx.inp.request_id,
        over.message,
        extra={"request_id": ctx.inp.request_id},
    )
    state.migrations += 1
    state.choices = []
    state.generations = []
    state.attempts.clear()
    await generate(ctx, over)


def _check_deadline(ctx: RequestContext) -> None:
    timeout = ctx.inp.timeout
    if timeout and time.perf_counter() - ctx.inp.received >= timeout:
        raise DeadlineExceededError(timeout)


async def _embed(ctx: RequestContext, http: HttpOut) -> None:
    timeout = ctx.inp.timeout
    if not timeout:
        await embed_stages.respond(ctx, await embed_stages.embed(ctx), http)
        return
    left = timeout - (time.perf_counter() - ctx.inp.received)
    try:
        async with asyncio.timeout(max(0.0, left)):
            result = await embed_stages.embed(ctx)
    except TimeoutError:
        raise DeadlineExceededError(timeout) from None
    await embed_stages.respond(ctx, result, http)


async def serve(
    deps: Deps,
    endpoint: str,
    body: bytes,
    received: float,
    http: HttpOut,
    exchange: Exchange | None = None,
    timeout: float = 0.0,
) -> int:
    """Answer one generation request on `http`; returns the HTTP status (200 once a stream
    started, whatever happened in it). `exchange` gets the context and the error code.
    `timeout`: the request's deadline in seconds after `received` (0: none); past it the
    engine requests are aborted and the client gets a 504 (an error event once the stream
    started)."""
    ctx: RequestContext | None = None
    sink: Sink | None = None
    try:
        ctx = parse(deps, endpoint, body, received, exchange, timeout)
        await run_stages(ctx, PROMPT_STAGES[endpoint])
        if endpoint == EMBEDDINGS:
            deps.metrics.active.inc()
            try:
                await _embed(ctx, http)
            finally:
                deps.metrics.active.dec()
            return 200
        await generate(ctx)
        _check_deadline(ctx)  # routing or a dispatcher wait may have used it up
        sink = sink_for(ctx, http)
        deps.metrics.active.inc()
        try:
            while True:
                try:
                    await stream(ctx, sink)
                    break
                except CannotResume as over:
                    if sink.started:
                        raise
                    await _start_over(ctx, over)
                    sink = sink_for(ctx, http)
            await finish(ctx, sink)
        finally:
            deps.metrics.active.dec()
        return 200
    except Exception as exc:
        err = as_request_error(exc)
        if err.code == ENGINE_REJECTED and err.param is None and ctx is not None:
            err.param = _constraint_field(ctx)
        if endpoint == RESPONSES:
            err = responses_error(err)
        if exchange is not None:
            exchange.error = err.code
        if sink is not None and await sink.fail(err):
            return 200
        await http.respond(err.status, err.body())
        return err.status
    finally:
        if ctx is not None:
            for gen in ctx.state.generations:
                await gen.stop()
