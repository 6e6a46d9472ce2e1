"""The token loop: every reply of every attempt of a request turned into output (hot path).

`TokenLoop.apply` is the per-batch work, behind one narrow boundary: a batch of replies that
arrived together in; out, the choices' output framed into the sink (each token delta goes to
its choice by attempt id and engine index, through the choice's text path: detokenize, stop
strings, parsers, logprobs) and the events of the batch: attempts that produced their first
token, ended (final message) or were stopped (stop strings), and failed. It does no I/O and
takes no decision. `TokenLoop.run` is the shell around it: it waits for a batch (one wake-up
per batch, no timer per token), applies it, writes the batch's frames in one go, and only
then tells the router of first tokens and ends (the client has them first). A failure (an
engine's, or an attempt the watchdog found silent) ends `run` with the failures of the batch,
its output still held: the lifecycle decides what follows (lifecycle.stream) and calls `run`
again, which writes the held output first. A request past its deadline, or ended by a
shutdown, raises (its engine requests are then aborted).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import msgspec

from switchyard.preprocessor.parsers.types import EMPTY
from switchyard.preprocessor.prefill_hop import HopStream
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import RequestContext, Sink
from switchyard.preprocessor.stages.generation import Generation
from switchyard.preprocessor.stages.logprobs import chat_entries
from switchyard.preprocessor.stages.watchdog import Watchdog
from switchyard.protos.messages import (
    GenerateFailed,
    GenerateFinished,
    TokenDelta,
    TokenLogprobs,
)

Failures = list[tuple[Generation, GenerateFailed]]


class Transitions(NamedTuple):
    """What the token loop reports of an attempt (lifecycle.py implements them)."""

    first_token: Callable[[Generation], Awaitable[None]]  # the client has its first token
    done: Callable[[Generation], Awaitable[None]]  # its engine request ended
    stop: Callable[[Generation], Awaitable[None]]  # no longer needed (stop strings)


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


class TokenLoop:
    __slots__ = (
        "_ctx",
        "_sink",
        "_on",
        "_itl",
        "_model",
        "_clock",
        "watchdog",
        "_last_tokens_at",
        "_held",
        "_firsts",
        "_ended",
        "_stopped",
        "_failures",
    )

    def __init__(self, ctx: RequestContext, transitions: Transitions) -> None:
        state = ctx.state
        deps = ctx.deps
        limits = deps.limits
        assert state.sink is not None
        self._ctx = ctx
        self._sink: Sink = state.sink
        self._on = transitions
        self._model = state.entry.name if state.entry is not None else ""
        self._itl = deps.metrics.itl.labels(self._model)  # looked up once per request
        self._clock = asyncio.get_running_loop().time
        self.watchdog = Watchdog(
            state.queue,
            state.generations,
            limits.first_token_timeout,
            limits.gap_timeout,
            end_at(ctx),
            ctx.inp.timeout,
            deps.shutdown,
        )
        self._last_tokens_at = 0.0
        self._held: tuple[bool, float, float] | None = None  # a batch not written yet
        self._firsts: list[tuple[Generation, str]] = []  # (generation, its attempt id)
        self._ended: list[Generation] = []
        self._stopped: list[Generation] = []
        self._failures: Failures = []

    def close(self) -> None:
        self.watchdog.cancel()

    # ---- one batch of replies in, output and events out (no I/O) --------------------------

    def apply(self, items: Any, now: float) -> bool:
        """Apply one batch of replies; True when it brought streamed tokens (for the TTFT and
        inter-token metrics). One function on purpose: it runs per reply, and each call it
        would make costs a measurable share of a token's time."""
        ctx = self._ctx
        state = ctx.state
        attempts = state.attempts
        sink = self._sink
        got_tokens = False
        for reply in items:
            gen = attempts.get(reply.request_id)
            if gen is None:
                continue  # an attempt that ended (migrated, stopped)
            kind = type(reply)
            if kind is GenerateFailed:
                if gen.unfinished:  # (else its choices are done: it is being stopped)
                    del attempts[reply.request_id]  # the rest of its replies are stale
                    self._failures.append((gen, reply))
                continue
            index = reply.index
            if index >= len(gen.choices):
                continue
            choice = gen.choices[index]
            if choice.done:
                continue
            if kind is not TokenDelta:
                if kind is GenerateFinished:
                    self._finished(gen, choice, reply)
                continue
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
                self._first(gen)
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
                    self._stopped.append(gen)
        return got_tokens

    def _first(self, gen: Generation) -> None:
        """The attempt's first token."""
        gen.got_tokens = True
        if isinstance(gen.stream, HopStream):
            gen.stream.started = True
        self._firsts.append((gen, gen.attempt_id))
        self.watchdog.arm()  # its deadline is now the (shorter) gap timeout

    def _finished(self, gen: Generation, choice: ChoiceOutput, reply: GenerateFinished) -> None:
        """The engine's end of a choice: its held-back output, its finish."""
        sink = self._sink
        if choice.replay_at >= 0:  # it ended before the output so far came again
            raise gen.diverged(choice)
        if choice.echo and not choice.echoed:
            sink.echo(choice)
        tail = choice.finish(reply.finish_reason, reply.matched_token_id)
        # A migrated attempt's prompt holds the output so far: cached, that is no prompt
        # token the client sent.
        choice.cached_tokens = min(reply.cached_tokens, len(choice.prompt))
        if type(tail) is str:
            if tail:
                sink.content(choice, tail)
        elif tail is not EMPTY:
            sink.parsed(choice, tail)  # type: ignore[arg-type]
        sink.finish(choice)
        self._ctx.state.unfinished -= 1
        gen.unfinished -= 1
        if not gen.unfinished:
            self._ended.append(gen)

    # ---- the shell: wait, apply, write, report ---------------------------------------------

    async def run(self) -> Failures:
        """Until every choice finished ([]), or some attempts failed (their failures)."""
        state = self._ctx.state
        queue = state.queue
        watchdog = self.watchdog
        timer = self._ctx.deps.timer
        clock = self._clock
        sink = self._sink
        watchdog.arm()  # (again after failures: the attempts changed)
        while True:
            if self._held is None:
                if not state.unfinished:
                    return []
                if watchdog.expired:
                    late = self._due()
                    if late is not None:
                        if late:
                            return late
                        continue
                if queue.empty():
                    await queue.wait()
                    continue
                items = queue.take()
                t0 = time.perf_counter() if timer is not None else 0.0
                now = clock()
                got = self.apply(items, now)
                if self._failures:
                    self._held = (got, now, t0)
                    failures, self._failures = self._failures, []
                    return failures
            else:  # the batch whose failures were just handled
                got, now, t0 = self._held
                self._held = None
            # Write the batch's output, then report its first tokens and ends.
            if got:
                if state.first_token_at is not None:
                    self._itl.observe(now - self._last_tokens_at)
                else:
                    self._first_token_at()
                self._last_tokens_at = now
            if timer is not None:
                t1 = time.perf_counter()
                timer.add("stream", t1 - t0)
                await sink.flush()
                timer.add("write", time.perf_counter() - t1)
            else:
                await sink.flush()
            if self._firsts or self._ended or self._stopped:
                await self._report()

    def _due(self) -> Failures | None:
        """The watchdog fired: raises the request's end (past its deadline, or shut down: its
        engine requests then abort); else the failures of the attempts silent too long, [] when
        none is (re-armed), None while replies wait to be applied first."""
        watchdog = self.watchdog
        end = watchdog.end_error()
        if end is not None:
            raise end
        state = self._ctx.state
        if not state.queue.empty():
            return None
        late = [(gen, gen.silent(watchdog.timeout(gen))) for gen in watchdog.overdue()]
        for gen, _ in late:
            state.attempts.pop(gen.attempt_id, None)
        if not late:
            watchdog.arm()
        return late

    def _first_token_at(self) -> None:
        """The request's first streamed tokens: its time to first token."""
        ctx = self._ctx
        at = ctx.state.first_token_at = time.perf_counter()
        ctx.deps.metrics.ttft.labels(self._model).observe(at - ctx.inp.received)

    async def _report(self) -> None:
        """Tell the lifecycle of the batch's first tokens and ends (after its output went)."""
        on = self._on
        if self._firsts:
            for gen, attempt_id in self._firsts:
                if gen.attempt_id == attempt_id:  # (not one that failed since)
                    await on.first_token(gen)
            self._firsts.clear()
        if self._ended:
            for gen in self._ended:
                await on.done(gen)
            self._ended.clear()
        if self._stopped:
            for gen in self._stopped:
                await on.stop(gen)
            self._stopped.clear()
