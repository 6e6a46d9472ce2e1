"""The lifecycle of a request's engine requests: the one state machine of an attempt.

    ROUTE -> [HOP] -> DISPATCH -> STREAM -> DONE
                                     |
                                     +--> FAILED -> migration.judge:
                                            migrate     -> ROUTE again (next attempt)
                                            cannot go on -> the request starts over from
                                                           its prompt, or fails
                                            fail        -> the request fails

`start` runs an attempt up to STREAM: the router picks the engine (and a prefill engine, for
a disaggregated request), the prefill hop or the dispatcher opens the engine request, whose
replies then land in the request's reply queue. The `stream` stage waits for the replies
and has the token loop turn each batch into output and events (first tokens, ends,
failures); it writes the output, reports the ends (`first_token`, `done`, `stop`), and sends
each failure through the migration policy here, never from inside the token loop. A
migration resends the prompt and the output so far to another engine (the engines are
deterministic per context, so the client sees one stream); a constrained output is
regenerated from the prompt instead and checked token by token (token_loop); one that
cannot be (sampled) starts the request over, or fails it once the client has part of it. An
attempt that went whole (generation.py) restarts from the prompt.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from switchyard.preprocessor.dispatcher_client import GenerationStream, NoDispatcher
from switchyard.preprocessor.errors import DeadlineExceededError, NoWorker
from switchyard.preprocessor.prefill_hop import HopStream, open_hop, supported
from switchyard.preprocessor.reply_queue import ReplyQueue
from switchyard.preprocessor.router_client import FALLBACK_POLICY, route_around
from switchyard.preprocessor.stages import answer, fanout
from switchyard.preprocessor.stages import generation as phases
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.preprocessor.stages.generation import Attempt, Generation
from switchyard.preprocessor.stages.migration import (
    CannotResume,
    Placement,
    check_hop,
    judge,
    resumable,
)
from switchyard.preprocessor.stages.token_loop import TokenLoop
from switchyard.protos.messages import (
    STAGE_FINISHED,
    STAGE_FIRST_TOKEN,
    EmbedRequest,
    GenerateFailed,
    GenerateRequest,
    Instance,
    RouteRequest,
    RouteResponse,
)

log = logging.getLogger(__name__)


# ---- ROUTE -----------------------------------------------------------------------------


async def route(
    ctx: RequestContext,
    request_id: str,
    token_ids: list[int],
    placement: Placement,
    whole: bool = False,
    attempt: int = 0,
) -> RouteResponse:
    """Ask the router where an engine request goes, avoiding what `placement` says; raises
    NoWorker when no engine can take it."""
    deps = ctx.deps
    timer = deps.timer
    trace = ctx.trace
    t0 = time.perf_counter()
    span = trace.span("route", **{"switchyard.attempt": attempt}) if trace is not None else None
    request = RouteRequest(
        request_id=request_id,
        model=ctx.request.model,
        token_ids=token_ids,
        exclude=placement.exclude,
        session_id=ctx.session_id,
        whole=whole,
        requires=list(ctx.requires),
    )
    reply = await route_around(deps.router, request, deps.limits.route_timeout, placement.refused)
    if reply.policy == FALLBACK_POLICY:
        deps.metrics.router_fallback.inc()
    if trace is not None and span is not None:
        span.set_attributes(
            {
                "switchyard.policy": reply.policy,
                "switchyard.instance_id": reply.instance_id or 0,
                "switchyard.overlap_blocks": reply.overlap_blocks,
                "switchyard.prompt_blocks": reply.prompt_blocks,
            }
        )
        if reply.instance_id is None:
            trace.fail(span, reply.error or "no_worker", "no engine available")
        else:
            span.end()
    if timer is not None:
        timer.add("route", time.perf_counter() - t0)
    if reply.instance_id is None:
        model = ctx.request.model
        raise NoWorker(reply.error, f"no engine available for model {model!r}", model)
    return reply


def _hop_pair(ctx: RequestContext, reply: RouteResponse) -> tuple[Instance, Instance] | None:
    if reply.prefill_instance_id is None or reply.instance_id is None:
        return None
    known = ctx.deps.instances()
    prefill = known.get(reply.prefill_instance_id)
    decode = known.get(reply.instance_id)
    if prefill is None or decode is None or not supported(prefill, decode):
        log.warning(
            "request_id=%s: no prefill hop from instance %d to %d (unknown or unsupported)",
            reply.request_id,
            reply.prefill_instance_id,
            reply.instance_id,
            extra={"request_id": reply.request_id},
        )
        return None
    return prefill, decode


# ---- ROUTE -> [HOP] -> DISPATCH -> STREAM ----------------------------------------------


async def start(gen: Generation, last_failure: GenerateFailed | None = None) -> None:
    """Run one attempt of `gen` up to STREAM (its replies then come to the token loop)."""
    ctx = gen.ctx
    deps = ctx.deps
    attempt_id = gen.next_id()
    placement = gen.placement
    routed = await route(
        ctx,
        attempt_id,
        gen.prompt_ids,
        placement,
        gen.whole_unless_hop(),
        placement.attempt,
    )
    generated = gen.resume_ids()
    # The prefill hop only before any token: a later migration resends the prompt and the
    # tokens so far to one worker, as without disaggregation.
    pair = _hop_pair(ctx, routed) if not generated else None
    if pair is not None:
        check_hop(deps, placement, last_failure)
        if len(gen.choices) > 1:
            # The engines take no `n` with disaggregation: one request per choice.
            await _split(gen, gen.choices[1:])
    whole = gen.whole_unless_hop() and pair is None
    request = gen.request(attempt_id, routed, generated, whole)
    att = gen.attempt = Attempt(gen, attempt_id, request.instance_id, whole, gen.predict(routed))
    trace = ctx.trace
    if trace is not None:
        request = _dispatch_span(att, request, pair)
    gen.unfinished = sum(1 for c in gen.choices if not c.done)
    ctx.attempts[attempt_id] = att
    t0 = time.perf_counter()
    if pair is not None:
        att.phase = phases.HOP
        placement.hops += 1
        att.prefill_instance_id = pair[0].instance_id
        hop = trace.span("prefill_hop", att.span) if trace is not None else None
        att.stream = await open_hop(
            lambda r, q: open_stream(ctx, r, q),
            request,
            *pair,
            deps.limits.first_token_timeout,
            ctx.queue,
            deps.metrics.internal_error,
        )
        if hop is not None:
            hop.end()
        stage = "hop"
    else:
        att.phase = phases.DISPATCH
        att.stream = await open_stream(ctx, request, ctx.queue)
        stage = "dispatch"
    if deps.timer is not None:
        deps.timer.add(stage, time.perf_counter() - t0)
    att.live = True
    att.phase = phases.STREAM
    att.last = asyncio.get_running_loop().time()


async def _split(gen: Generation, others: list[ChoiceOutput]) -> None:
    """Serve `others` from one new generation each; `gen` keeps the rest."""
    gen.choices = [c for c in gen.choices if c not in others]
    for choice in others:
        sibling = gen.sibling(choice)
        gen.ctx.generations.append(sibling)
        await start(sibling)


def _dispatch_span(
    att: Attempt, request: GenerateRequest, pair: tuple[Instance, Instance] | None
) -> GenerateRequest:
    """Start the attempt's dispatch and first_token spans; the request then carries the
    dispatch span's context to the engine."""
    ctx = att.gen.ctx
    trace = ctx.trace
    assert trace is not None
    instance = ctx.deps.instances().get(request.instance_id)
    span = att.span = trace.span(
        "dispatch",
        **{
            "switchyard.engine_request_id": request.request_id,
            "switchyard.worker": instance.url if instance is not None else "",
            "switchyard.attempt": att.gen.placement.attempt,
            "switchyard.prefill_worker": pair[0].url if pair is not None else "",
        },
    )
    att.first_span = trace.span("first_token", span)
    return msgspec.structs.replace(request, traceparent=trace.traceparent(span))


async def open_stream(
    ctx: RequestContext, request: GenerateRequest | EmbedRequest, queue: ReplyQueue | None
) -> GenerationStream:
    """Open the engine request through a dispatcher; NoWorker when none is reachable."""
    try:  # waits (bounded) for a replica while the only dispatcher restarts
        return await ctx.deps.dispatcher.open(request, queue)
    except NoDispatcher as exc:
        raise NoWorker("no_dispatcher", str(exc)) from None


# ---- STREAM -> DONE ----------------------------------------------------------------------


async def first_token(att: Attempt) -> None:
    """The client has this attempt's first token: the router frees its prefill booking."""
    if not att.live:
        return
    if att.first_span is not None:
        att.first_span.end()
        att.first_span = None
    await att.gen.ctx.deps.router.progress(att.id, att.instance_id, STAGE_FIRST_TOKEN, final=False)


async def done(gen: Generation) -> None:
    """The engine sent its final message for every choice of this attempt."""
    att = gen.attempt
    assert att is not None
    if att.stream is not None:
        att.stream.close()
    await _end(att)


async def stop(gen: Generation) -> None:
    """The request no longer needs this generation's attempt (stop strings, client gone,
    error)."""
    att = gen.attempt
    if att is None:
        return
    if att.live and att.stream is not None:
        await att.stream.cancel()
    await _end(att)


def _end_spans(att: Attempt, failure: GenerateFailed | None = None) -> None:
    trace = att.gen.ctx.trace
    assert trace is not None
    for span in (att.first_span, att.span):
        if span is None:
            continue
        if failure is not None:
            trace.fail(span, failure.kind, failure.message)
        else:
            span.end()
    att.first_span = att.span = None


async def _end(att: Attempt) -> None:
    if att.span is not None:
        _end_spans(att)
    if att.phase != phases.FAILED:
        att.phase = phases.DONE
    if not att.live:
        return
    att.live = False
    ctx = att.gen.ctx
    ctx.attempts.pop(att.id, None)
    await ctx.deps.router.progress(att.id, att.instance_id, STAGE_FINISHED, final=True)


# ---- STREAM -> FAILED -> migrate | start over | fail --------------------------------------


async def fail(gen: Generation, failure: GenerateFailed) -> CannotResume | None:
    """An attempt failed: returns None once the next attempt runs (migrated), a
    CannotResume when only starting the request over could help; raises when the request
    fails."""
    att = gen.attempt
    assert att is not None
    att.phase = phases.FAILED
    if isinstance(att.stream, HopStream):
        failure = att.stream.blame(failure)
    if att.span is not None:
        _end_spans(att, failure)
    await stop(gen)
    ctx = gen.ctx
    left = gen.left()
    so_far = max((len(c.generated) for c in left), default=0)
    over = await judge(ctx, gen.placement, failure, so_far, resumable(gen.sampling))
    if over is not None:
        return over
    tokens = sum(len(c.generated) for c in left)
    log.warning(
        "migrating request_id=%s from instance_id=%d kind=%s after %d tokens: %s",
        att.id,
        failure.instance_id,
        failure.kind,
        tokens,
        failure.message,
        extra={"request_id": ctx.inp.request_id},
    )
    trace = ctx.trace
    span = None
    if trace is not None:
        span = trace.span(
            "migration",
            **{
                "switchyard.kind": failure.kind,
                "switchyard.from_instance_id": failure.instance_id,
                "switchyard.attempt": gen.placement.attempt,
                "switchyard.tokens_so_far": tokens,
            },
        )
    gen.choices = left
    try:
        if len(left) > 1 and any(c.generated for c in left):
            await _split(gen, left[1:])  # each diverged choice resumes on its own
        await start(gen, failure)
    except BaseException as exc:
        if trace is not None and span is not None:
            trace.fail(span, type(exc).__name__, str(exc))
        raise
    if span is not None:
        span.end()
    return None


async def stop_all(ctx: RequestContext) -> None:
    """End every attempt of the request still running (it failed, or is over)."""
    for gen in ctx.generations:
        await stop(gen)


def raise_if_past_deadline(ctx: RequestContext) -> None:
    """Routing, a hop or a dispatcher wait may have used the request's deadline up."""
    timeout = ctx.inp.timeout
    if timeout and time.perf_counter() - ctx.inp.received >= timeout:
        raise DeadlineExceededError(timeout)


# ---- the request's stages around the attempts ------------------------------------------


async def generate(ctx: RequestContext, placement: Placement | None = None) -> None:
    """The `generate` stage: start each prompt's generation (route -> hop -> dispatch), then
    open the answer's sink. `placement`: a request that starts over (its attempts counted
    on, the engines that failed it avoided)."""
    fanout.generations(ctx, placement)
    for gen in list(ctx.generations):  # a start may add generations (split choices)
        if gen.attempt is None:
            await start(gen)
    raise_if_past_deadline(ctx)
    ctx.sink = answer.sink_for(ctx)
    if not ctx.active:
        ctx.active = True
        ctx.deps.metrics.active.inc()


async def stream(ctx: RequestContext) -> None:
    """The `stream` stage: wait for each batch of replies, have the token loop apply it,
    write its output in one go, then report its first tokens and ends; a failure it reports
    goes through the migration policy first (while the batch's output is held, so that a
    request that fails before its first byte still gets an HTTP status)."""
    queue = ctx.queue
    timer = ctx.deps.timer
    clock = asyncio.get_running_loop().time
    loop = TokenLoop(ctx)
    watchdog = loop.watchdog
    try:
        while ctx.unfinished:
            if watchdog.expired:
                late = loop.due()
                if late is not None:
                    if late:
                        loop = await _failed(ctx, loop, late)
                    continue
            if queue.empty():
                await queue.wait()
                if watchdog.expired or queue.empty():
                    continue
            items = queue.take()
            t0 = time.perf_counter() if timer is not None else 0.0
            now = clock()
            got = loop.apply(items, now)
            if loop.failures:
                failures, loop.failures = loop.failures, []
                again = await _failed(ctx, loop, failures)
                if again is not loop:  # started over: the batch's output is dropped
                    loop = again
                    continue
            if got:
                loop.observe(now)
            sink = ctx.sink
            assert sink is not None
            if timer is not None:
                t1 = time.perf_counter()
                timer.add("stream", t1 - t0)
                await sink.flush()
                timer.add("write", time.perf_counter() - t1)
            else:
                await sink.flush()
            if loop.firsts or loop.ended or loop.stopped:
                await _report(loop)
    finally:
        loop.close()


async def _report(loop: TokenLoop) -> None:
    """A batch's first tokens and ends, once its output went to the client."""
    for att in loop.firsts:
        if att.gen.attempt is att:  # (not one that failed since)
            await first_token(att)
    loop.firsts.clear()
    for gen in loop.ended:
        await done(gen)
    loop.ended.clear()
    for gen in loop.stopped:
        await stop(gen)
    loop.stopped.clear()


async def _failed(
    ctx: RequestContext, loop: TokenLoop, failures: list[tuple[Generation, GenerateFailed]]
) -> TokenLoop:
    """Each failed attempt through the policy; the token loop to go on with (a new one when
    the request started over)."""
    for gen, failure in failures:
        over = await fail(gen, failure)
        if over is None:
            continue
        sink = ctx.sink
        if sink is not None and sink.started:
            raise over  # the client has part of an output that cannot go on
        loop.close()
        await start_over(ctx, over)
        return TokenLoop(ctx)  # the other failures were of the generations dropped
    loop.watchdog.arm()  # the attempts changed
    return loop


async def start_over(ctx: RequestContext, over: CannotResume) -> None:
    """The request from the prompt again, its output so far dropped (the client has none of
    it): what a sampled constrained output does when its engine fails."""
    await stop_all(ctx)
    log.warning(
        "starting request_id=%s over from the prompt: %s",
        ctx.inp.request_id,
        over.message,
        extra={"request_id": ctx.inp.request_id},
    )
    ctx.choices = []
    ctx.generations = []
    ctx.attempts.clear()
    ctx.restarts += 1
    await generate(ctx, over.placement)
