"""The `stream` stage: every reply of every attempt of a request, in one loop (hot path).

Per batch of replies that arrived together: each token delta goes to its choice (by attempt id
and engine index) and through the choice's text path (detokenize, stop strings, parsers) into
the sink, with its logprobs; a final message ends its choice; a failure migrates its attempt
(Generation.fail). Then the batch's frames are written in one go, and only after that is the
router told of first tokens (the client has them first). An attempt silent for too long (the
watchdog) fails like a cut stream; a request past its deadline, or ended by a shutdown,
raises (its engine requests are then aborted). There are no generator layers and no timer
per token: one wake-up per batch, one write per batch.
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from switchyard.preprocessor.parsers.types import EMPTY
from switchyard.preprocessor.prefill_hop import HopStream
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.preprocessor.stages.generation import Generation
from switchyard.preprocessor.stages.logprobs import chat_entries
from switchyard.preprocessor.stages.sinks import Sink
from switchyard.preprocessor.stages.watchdog import Watchdog
from switchyard.protos.messages import (
    GenerateFailed,
    GenerateFinished,
    TokenDelta,
    TokenLogprobs,
)


def _logprobs(ctx: RequestContext, sink: Sink, choice: ChoiceOutput, reply: TokenDelta) -> None:
    detail = reply.detail
    assert detail is not None
    state = ctx.state
    texts = state.tokenizer.token_texts  # type: ignore[union-attr]
    lp = choice.completion_logprobs
    if detail.prompt_logprobs is not None and lp is not None:
        part = lp.add_prompt(choice.prompt, detail.prompt_logprobs)
        if choice.echo and not choice.echoed:
            sink.echo(choice)
        sink.logprobs(choice, part)
    elif choice.echo and not choice.echoed:
        sink.echo(choice)
    if detail.logprobs is not None and reply.token_ids:
        if lp is not None:
            sink.logprobs(choice, lp.add_output(reply.token_ids, detail.logprobs))
        else:
            entries = chat_entries(texts, reply.token_ids, detail.logprobs, state.top_logprobs)
            sink.logprobs(choice, entries)


def _past_replay(gen: Generation, choice: ChoiceOutput, reply: TokenDelta) -> TokenDelta | None:
    """What of a regenerated constrained output's delta is new (None: nothing); raises when
    it differs from the output the client already has."""
    ids = reply.token_ids
    k = choice.past_replay(ids)
    if k < 0:
        raise gen.diverged(choice)
    if k == 0:
        return reply
    if k == len(ids):
        return None
    detail = reply.detail
    if detail is not None and detail.logprobs is not None:
        lp = detail.logprobs
        rest = TokenLogprobs(lp.logprobs[k:], lp.top_ids[k:], lp.top_logprobs[k:])
        detail = msgspec.structs.replace(detail, logprobs=rest)
    return TokenDelta(reply.request_id, ids[k:], detail)


def end_at(ctx: RequestContext) -> float | None:
    """The request's deadline in loop time (None: it has none)."""
    timeout = ctx.inp.timeout
    if not timeout:
        return None
    spent = time.perf_counter() - ctx.inp.received
    return asyncio.get_running_loop().time() + timeout - spent


async def stream(ctx: RequestContext, sink: Sink) -> None:
    """Runs until every choice has finished; raises the request's failure."""
    state = ctx.state
    deps = ctx.deps
    limits = deps.limits
    queue = state.queue
    attempts = state.attempts
    timer = deps.timer
    model = state.entry.name if state.entry is not None else ""
    itl = deps.metrics.itl.labels(model)  # looked up once per request, observed per batch
    clock = asyncio.get_running_loop().time
    watchdog = Watchdog(
        queue,
        state.generations,
        limits.first_token_timeout,
        limits.gap_timeout,
        end_at(ctx),
        ctx.inp.timeout,
        deps.shutdown,
    )
    watchdog.arm()
    last_tokens_at = 0.0
    firsts: list[Generation] = []
    ended: list[Generation] = []
    stopped: list[Generation] = []
    try:
        while state.unfinished:
            if watchdog.expired:
                end = watchdog.end_error()
                if end is not None:
                    raise end  # past the deadline, or shut down: the engine requests abort
                if queue.empty():
                    for late in watchdog.overdue():
                        await late.fail(late.silent(watchdog.timeout(late)))
                    watchdog.arm()
                    continue
            if queue.empty():
                await queue.wait()
                continue
            items = queue.take()
            t0 = time.perf_counter() if timer is not None else 0.0
            now = clock()
            got_tokens = False
            for reply in items:
                gen = attempts.get(reply.request_id)
                if gen is None:
                    continue  # an attempt that ended (migrated, stopped)
                kind = type(reply)
                if kind is GenerateFailed:
                    await gen.fail(reply)
                    watchdog.ensure()
                    continue
                index = reply.index
                if index >= len(gen.choices):
                    continue
                choice = gen.choices[index]
                if choice.done:
                    continue
                if kind is TokenDelta:
                    gen.last = now
                    if choice.replay_at >= 0:  # a migrated constrained output, coming again
                        reply = _past_replay(gen, choice, reply)
                        if reply is None:
                            continue
                    ids = reply.token_ids
                    if reply.detail is not None:
                        _logprobs(ctx, sink, choice, reply)
                    elif choice.echo and not choice.echoed:
                        sink.echo(choice)
                    if not ids:
                        continue
                    choice.generated += ids
                    if not gen.whole:  # a whole reply's time is no first token's, no ITL
                        got_tokens = True
                    if not gen.got_tokens:
                        gen.got_tokens = True
                        if isinstance(gen.stream, HopStream):
                            gen.stream.started = True
                        firsts.append(gen)
                        watchdog.arm()  # its deadline is now the (shorter) gap timeout
                    if choice.parser is None:
                        text = choice.text(ids)
                        if text:
                            sink.content(choice, text)
                    else:
                        parsed = choice.parsed(ids)
                        if parsed is not EMPTY:
                            sink.parsed(choice, parsed)
                    if choice.done:  # a stop string completed
                        choice.stopped_reason()
                        sink.finish(choice)
                        state.unfinished -= 1
                        gen.unfinished -= 1
                        if not gen.unfinished:
                            stopped.append(gen)
                elif kind is GenerateFinished:
                    if choice.replay_at >= 0:  # it ended before the output so far came again
                        raise gen.diverged(choice)
                    if choice.echo and not choice.echoed:
                        sink.echo(choice)
                    tail = choice.finish(reply.finish_reason)
                    # A migrated attempt's prompt holds the output so far: cached, that is
                    # no prompt token the client sent.
                    choice.cached_tokens = min(reply.cached_tokens, len(choice.prompt))
                    if type(tail) is str:
                        if tail:
                            sink.content(choice, tail)
                    elif tail is not EMPTY:
                        sink.parsed(choice, tail)  # type: ignore[arg-type]
                    sink.finish(choice)
                    state.unfinished -= 1
                    gen.unfinished -= 1
                    if not gen.unfinished:
                        ended.append(gen)
            if got_tokens:
                if state.first_token_at is None:
                    state.first_token_at = time.perf_counter()
                    deps.metrics.ttft.labels(model).observe(state.first_token_at - ctx.inp.received)
                else:
                    itl.observe(now - last_tokens_at)
                last_tokens_at = now
            if timer is not None:
                t1 = time.perf_counter()
                timer.add("stream", t1 - t0)
                await sink.flush()
                timer.add("write", time.perf_counter() - t1)
            else:
                await sink.flush()
            if firsts:
                for gen in firsts:
                    if gen.open:
                        await gen.first_token_sent()
                firsts.clear()
            if ended:
                for gen in ended:
                    await gen.finished()
                ended.clear()
            if stopped:
                for gen in stopped:
                    await gen.stop()
                stopped.clear()
    finally:
        watchdog.cancel()
