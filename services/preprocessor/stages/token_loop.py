"""The token loop: every reply of every attempt of a request turned into output (hot path).

`TokenLoop.apply` is the per-batch work, behind one narrow boundary: a batch of replies that
arrived together in; out, the choices' output framed into the sink (each token delta goes to
its choice by attempt id and engine index, through the choice's text path: detokenize, stop
strings, parsers, logprobs) and the events of the batch: attempts that produced their first
token (`firsts`), ended with a final message (`ended`) or were stopped by a stop string
(`stopped`), and failures (`failures`). It does no I/O and takes no decision: the lifecycle
(lifecycle.stream) waits for each batch, writes the sink's frames in one go, reports the
events, and sends failures through the migration policy. `due` is the watchdog's side: the
attempts silent for too long fail like a cut stream; a request past its deadline, or ended by
a shutdown, raises. One wake-up per batch, no timer per token.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from switchyard.preprocessor.parsers.types import EMPTY
from switchyard.preprocessor.prefill_hop import HopStream
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import RequestContext, Sink
from switchyard.preprocessor.stages.generation import Attempt, Generation
from switchyard.preprocessor.stages.logprobs import chat_entries
from switchyard.preprocessor.stages.watchdog import Watchdog
from switchyard.protos.messages import (
    GenerateFailed,
    GenerateFinished,
    TokenDelta,
    TokenLogprobs,
)

Failures = list[tuple[Generation, GenerateFailed]]


def _logprobs(ctx: RequestContext, sink: Sink, choice: ChoiceOutput, reply: TokenDelta) -> None:
    detail = reply.detail
    assert detail is not None
    texts = ctx.tokenizer.token_texts  # type: ignore[union-attr]
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
            entries = chat_entries(texts, reply.token_ids, detail.logprobs, ctx.top_logprobs)
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
        "_itl",
        "_model",
        "watchdog",
        "_last_tokens_at",
        "firsts",
        "ended",
        "stopped",
        "failures",
    )

    def __init__(self, ctx: RequestContext) -> None:
        deps = ctx.deps
        limits = deps.limits
        assert ctx.sink is not None
        self._ctx = ctx
        self._sink: Sink = ctx.sink
        self._model = ctx.entry.name if ctx.entry is not None else ""
        self._itl = deps.metrics.itl.labels(self._model)  # looked up once per request
        self.watchdog = Watchdog(
            ctx.queue,
            ctx.generations,
            limits.first_token_timeout,
            limits.gap_timeout,
            end_at(ctx),
            ctx.inp.timeout,
            deps.shutdown,
        )
        self.watchdog.arm()
        self._last_tokens_at = 0.0
        # The events of the batches applied since the lifecycle last took them:
        self.firsts: list[Attempt] = []
        self.ended: list[Generation] = []
        self.stopped: list[Generation] = []
        self.failures: Failures = []

    def close(self) -> None:
        self.watchdog.cancel()

    # ---- one batch of replies in, output and events out (no I/O) --------------------------

    def apply(self, items: Any, now: float) -> bool:
        """Apply one batch of replies; True when it brought streamed tokens (for the TTFT and
        inter-token metrics). One function on purpose: it runs per reply, and each call it
        would make costs a measurable share of a token's time."""
        ctx = self._ctx
        attempts = ctx.attempts
        sink = self._sink
        got_tokens = False
        for reply in items:
            att = attempts.get(reply.request_id)
            if att is None:
                continue  # an attempt that ended (migrated, stopped)
            gen = att.gen
            kind = type(reply)
            if kind is GenerateFailed:
                if gen.unfinished:  # (else its choices are done: it is being stopped)
                    del attempts[reply.request_id]  # the rest of its replies are stale
                    self.failures.append((gen, reply))
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
            att.last = now
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
            if not att.whole:  # a whole reply's time is no first token's, no ITL
                got_tokens = True
            if not att.got_tokens:
                self._first(att)
            if choice.parser is None:
                text = choice.text(ids)
                if text:
                    sink.content(choice, text)
            else:
                parsed = choice.parsed(ids)
                if parsed is not EMPTY:
                    sink.parsed(choice, parsed)
            if choice.done:  # a stop string completed
                if choice.overrun:  # inside this delta: what came after it never happened
                    del choice.generated[-choice.overrun :]
                choice.stopped_reason()
                sink.finish(choice)
                ctx.unfinished -= 1
                gen.unfinished -= 1
                if not gen.unfinished:
                    self.stopped.append(gen)
        return got_tokens

    def _first(self, att: Attempt) -> None:
        """The attempt's first token."""
        att.got_tokens = True
        if isinstance(att.stream, HopStream):
            att.stream.started = True
        self.firsts.append(att)
        # A streamed attempt's deadline is now the (shorter) gap timeout. A whole one's
        # timeout stays what it was, and its deadline only moves later (from `att.last`),
        # which the watchdog's timer finds when it fires: no re-arm, per request, for the
        # one reply that usually ends it.
        if not att.whole:
            self.watchdog.arm()

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
        self._ctx.unfinished -= 1
        gen.unfinished -= 1
        if not gen.unfinished:
            self.ended.append(gen)

    # ---- around the batches -----------------------------------------------------------

    def observe(self, now: float) -> None:
        """A batch brought streamed tokens: the request's TTFT, or an inter-token latency."""
        if self._ctx.first_token_at is not None:
            self._itl.observe(now - self._last_tokens_at)
        else:
            ctx = self._ctx
            at = self._ctx.first_token_at = time.perf_counter()
            ctx.deps.metrics.ttft.labels(self._model).observe(at - ctx.inp.received)
        self._last_tokens_at = now

    def due(self) -> Failures | None:
        """The watchdog fired: raises the request's end (past its deadline, or shut down: its
        engine requests then abort); else the failures of the attempts silent too long, [] when
        none is (re-armed), None while replies wait to be applied first."""
        watchdog = self.watchdog
        end = watchdog.end_error()
        if end is not None:
            raise end
        if not self._ctx.queue.empty():
            return None
        overdue = watchdog.overdue()
        for att in overdue:
            self._ctx.attempts.pop(att.id, None)
        late = [(att.gen, att.silent(watchdog.timeout(att))) for att in overdue]
        if not late:
            watchdog.arm()
        return late
