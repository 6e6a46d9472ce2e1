"""The `stream` stage: every reply of every attempt of a request, in one loop (hot path).

Per batch of replies that arrived together: each token delta goes through its choice's text
path (detokenize, stop strings, parsers) into the sink; a final message ends its choice; a
failure migrates its attempt (Generation.fail). Then the batch's frames are written in one go,
and only after that is the router told of first tokens (the client has them first). An attempt
silent for too long (the watchdog) fails like a cut stream. There are no generator layers and
no timer per token: one wake-up per batch, one write per batch.
"""

from __future__ import annotations

import asyncio
import time

from switchyard.preprocessor.prefill_hop import HopStream
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.preprocessor.stages.generation import Generation
from switchyard.preprocessor.stages.sinks import CollectSink, StreamSink
from switchyard.preprocessor.stages.watchdog import Watchdog
from switchyard.protos.messages import GenerateFailed, GenerateFinished, TokenDelta


async def stream(ctx: RequestContext, sink: StreamSink | CollectSink) -> None:
    """Runs until every choice has finished; raises the request's failure."""
    state = ctx.state
    deps = ctx.deps
    limits = deps.limits
    queue = state.queue
    attempts = state.attempts
    timer = deps.timer
    itl = deps.metrics.itl
    clock = asyncio.get_running_loop().time
    watchdog = Watchdog(queue, state.generations, limits.first_token_timeout, limits.gap_timeout)
    watchdog.arm()
    last_tokens_at = 0.0
    firsts: list[Generation] = []
    ended: list[Generation] = []
    stopped: list[Generation] = []
    try:
        while state.unfinished:
            if queue.empty():
                if watchdog.expired:
                    for gen in watchdog.overdue():
                        await gen.fail(gen.silent(watchdog.timeout(gen)))
                    watchdog.arm()
                    continue
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
                choice = gen.choice
                if choice.finish_reason is not None:
                    continue
                kind = type(reply)
                if kind is TokenDelta:
                    ids = reply.token_ids
                    gen.last = now
                    gen.generated += ids
                    got_tokens = True
                    if not gen.got_tokens:
                        gen.got_tokens = True
                        if isinstance(gen.stream, HopStream):
                            gen.stream.started = True
                        firsts.append(gen)
                        watchdog.arm()  # its deadline is now the (shorter) gap timeout
                    text = choice.feed(ids)
                    if text:
                        sink.content(choice, text)
                    if choice.finish_reason is not None:  # a stop string completed
                        sink.finish(choice)
                        state.unfinished -= 1
                        stopped.append(gen)
                elif kind is GenerateFinished:
                    tail = choice.finish(reply.finish_reason)
                    choice.cached_tokens = reply.cached_tokens
                    if tail:
                        sink.content(choice, tail)
                    sink.finish(choice)
                    state.unfinished -= 1
                    ended.append(gen)
                elif kind is GenerateFailed:
                    await gen.fail(reply)
                    watchdog.ensure()
            if got_tokens:
                if state.first_token_at is None:
                    state.first_token_at = time.perf_counter()
                    deps.metrics.ttft.observe(state.first_token_at - ctx.inp.received)
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
