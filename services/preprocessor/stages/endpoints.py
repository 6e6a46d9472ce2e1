"""Each endpoint's stages, in order, built in this one place, and `serve`, which runs them.

    chat:         parse, model, template, outputs, tokenize, check, admit, generate, stream,
                  finish
    responses:    parse, history, model, template, outputs, tokenize, check, admit, generate,
                  stream, finish
    messages:     parse, model, thinking, template, outputs, tokenize, check, admit, generate,
                  stream, finish
    completions:  parse, model,                    tokenize, check, admit, generate, stream,
                  finish
    embeddings:   parse, model,                    tokenize,        admit, embed,    finish

`parse` reads the body into the endpoint's request type; `model`, `template`, `outputs`,
`tokenize`, `check` are the prompt's (prompt.py; embeddings tokenize in embed.py); `admit`
waits for the deployment's flow gate (admit.py; with --flow-config); `generate` starts each
prompt's engine request (route -> prefill hop -> dispatch) and opens the answer's sink;
`stream` runs the token loop and migrates what fails (lifecycle.py); `finish` writes the
answer's end, usage and metrics (answer.py). The Responses API is chat's stages with its own
parse (its request as the chat request it amounts to, responses_requests), `history` (the
stored context of previous_response_id or a conversation, read before any engine work:
stored.py) and its own sinks (responses.py, which keep the response at its end), its errors
renamed to its fields; so is the Anthropic Messages API (anthropic_requests; messages.py:
its thinking stage and sinks), whose errors also take Anthropic's shape. Every failure
becomes an error in the API's shape here: an HTTP status before the first byte of the
answer, an error event inside a stream after it.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from switchyard.preprocessor.anthropic_requests import anthropic_error, parse_messages
from switchyard.preprocessor.errors import ENGINE_REJECTED, as_request_error
from switchyard.preprocessor.openai_requests import (
    parse_chat_completion,
    parse_completion,
    parse_embeddings,
)
from switchyard.preprocessor.responses_requests import parse_responses, responses_error
from switchyard.preprocessor.stages import (
    admit,
    answer,
    embed,
    lifecycle,
    messages,
    prompt,
    stored,
)
from switchyard.preprocessor.stages.context import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    RESPONSES,
    Body,
    Deps,
    HttpOut,
    RequestContext,
    RequestInput,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span


class Stage(NamedTuple):
    name: str
    run: Callable[[RequestContext], Awaitable[None] | None]
    # Timed under its name with --stage-timing (generate and stream time their own parts:
    # route, hop, dispatch; stream, write).
    timed: bool = True


PARSERS: dict[str, Callable[[bytes], Body]] = {
    CHAT: parse_chat_completion,
    COMPLETIONS: parse_completion,
    EMBEDDINGS: parse_embeddings,
    RESPONSES: parse_responses,
    MESSAGES: parse_messages,
}
ID_PREFIX = {
    CHAT: "chatcmpl-",
    COMPLETIONS: "cmpl-",
    EMBEDDINGS: "embd-",
    RESPONSES: "resp_",
    MESSAGES: "msg_",
}


def parse(ctx: RequestContext) -> None:
    """The body into the endpoint's request type; the session key is the x-session-id
    header, else the body's `user`."""
    ctx.body = request = PARSERS[ctx.inp.endpoint](ctx.raw)
    ctx.raw = b""
    ctx.session_id = ctx.inp.session_id or request.user


PARSE = Stage("parse", parse)
HISTORY = Stage("history", stored.history)
MODEL = Stage("model", prompt.resolve_model)
THINKING = Stage("thinking", messages.thinking)
TEMPLATE = Stage("template", prompt.render_template)
OUTPUTS = Stage("outputs", prompt.outputs)
TOKENIZE = Stage("tokenize", prompt.tokenize)
CHECK = Stage("check", prompt.check)
ADMIT = Stage("admit", admit.admit, timed=False)  # its wait: flow_wait_seconds
GENERATE = Stage("generate", lifecycle.generate, timed=False)
STREAM = Stage("stream", lifecycle.stream, timed=False)
FINISH = Stage("finish", answer.finish)

PIPELINES: dict[str, tuple[Stage, ...]] = {
    CHAT: (PARSE, MODEL, TEMPLATE, OUTPUTS, TOKENIZE, CHECK, ADMIT, GENERATE, STREAM, FINISH),
    RESPONSES: (
        PARSE,
        HISTORY,
        MODEL,
        TEMPLATE,
        OUTPUTS,
        TOKENIZE,
        CHECK,
        ADMIT,
        GENERATE,
        STREAM,
        FINISH,
    ),
    MESSAGES: (
        PARSE,
        MODEL,
        THINKING,
        TEMPLATE,
        OUTPUTS,
        TOKENIZE,
        CHECK,
        ADMIT,
        GENERATE,
        STREAM,
        FINISH,
    ),
    COMPLETIONS: (PARSE, MODEL, TOKENIZE, CHECK, ADMIT, GENERATE, STREAM, FINISH),
    EMBEDDINGS: (
        PARSE,
        MODEL,
        Stage("tokenize", embed.tokenize),
        ADMIT,
        Stage("embed", embed.embed, timed=False),
        Stage("finish", embed.respond),
    ),
}


def prompt_stages(endpoint: str) -> tuple[Stage, ...]:
    """An endpoint's stages up to the flow gate or the first that involves an engine
    (/debug/route)."""
    stages = PIPELINES[endpoint]
    first = next(i for i, s in enumerate(stages) if s.name in ("admit", "generate", "embed"))
    return stages[:first]


# The stages worth a span of their own (the others take microseconds; a span costs tens of
# microseconds of Python, and its export more: bench/operability.py).
TRACED_STAGES = frozenset({"template", "tokenize"})


async def run_stages(ctx: RequestContext, stages: tuple[Stage, ...]) -> None:
    """Run `stages` in order (`serve` runs an endpoint's whole list the same way)."""
    for stage in stages:
        t0 = time.perf_counter()
        span = _span(ctx, stage)
        result = stage.run(ctx)
        if inspect.isawaitable(result):
            await result
        _timed(ctx, stage, span, t0)


def _span(ctx: RequestContext, stage: Stage) -> Span | None:
    trace = ctx.trace
    return trace.span(stage.name) if trace is not None and stage.name in TRACED_STAGES else None


def _timed(ctx: RequestContext, stage: Stage, span: Span | None, t0: float) -> None:
    if span is not None:
        span.end()
    timer = ctx.deps.timer
    if timer is not None and stage.timed:
        timer.add(stage.name, time.perf_counter() - t0)


def new_request(
    deps: Deps,
    endpoint: str,
    http: HttpOut,
    received: float | None = None,
    *,
    request_id: str = "",
    engine_prefix: str = "",
    session_id: str | None = None,
    timeout: float = 0.0,
    path: str = "",
    tenant: str = "",
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> RequestContext:
    """A request's context, before its body is read (its id minted unless given).
    `timeout`: its deadline, seconds after `received` (0: none)."""
    return RequestContext(
        RequestInput(
            endpoint,
            request_id or f"{ID_PREFIX[endpoint]}{uuid.uuid4().hex}",
            http,
            time.perf_counter() if received is None else received,
            path=path,
            engine_prefix=engine_prefix,
            session_id=session_id,
            timeout=timeout,
            tenant=tenant,
            headers=headers,
        ),
        deps,
    )


def _constraint_field(ctx: RequestContext) -> str | None:
    """The field whose constraint the engine was sent, if any: everything else an engine
    could refuse is checked before it is sent, so its refusal is of the grammar it had to
    compile (a schema feature it lacks, an invalid regex)."""
    if ctx.extra.get("constraint") is not None:
        return "tools"  # tool_choice's schema, built from the tools' parameters
    sampling = getattr(ctx.body, "sampling", None)
    if sampling is not None and sampling.constraint is not None:
        return sampling.constraint_param or None
    return None


async def serve(ctx: RequestContext, body: bytes) -> int:
    """Answer one request on `ctx.inp.http`; returns the HTTP status (200 once a stream
    started, whatever happened in it). Past the request's deadline the engine requests are
    aborted and the client gets a 504 (an error event once the stream started)."""
    endpoint = ctx.inp.endpoint
    try:
        ctx.raw = body
        # The stages' loop is run_stages', here in place: a coroutine that awaits another
        # adds a frame every reply batch resumes (the stream stage waits inside). Without a
        # trace or --stage-timing there is nothing to do around a stage: a stage returns None
        # or its coroutine.
        if ctx.trace is None and ctx.deps.timer is None:
            for stage in PIPELINES[endpoint]:
                result = stage.run(ctx)
                if result is not None:
                    await result
            return 200
        for stage in PIPELINES[endpoint]:
            t0 = time.perf_counter()
            span = _span(ctx, stage)
            result = stage.run(ctx)
            if inspect.isawaitable(result):
                await result
            _timed(ctx, stage, span, t0)
        return 200
    except Exception as exc:
        err = as_request_error(exc)
        extra = err.headers()  # a 429's Retry-After, whatever shape the API gives the body
        if err.code == ENGINE_REJECTED and err.param is None and ctx.body is not None:
            err.param = _constraint_field(ctx)
        if endpoint == RESPONSES:
            err = responses_error(err)
        elif endpoint == MESSAGES:
            err = anthropic_error(err)
        ctx.error = err.code
        if ctx.sink is not None and await ctx.sink.fail(err):
            return 200
        await ctx.inp.http.respond(err.status, err.body(), extra or None)
        return err.status
    finally:
        await lifecycle.stop_all(ctx)
        admit.release(ctx)
        if ctx.active:
            ctx.active = False
            ctx.deps.metrics.active.dec()
