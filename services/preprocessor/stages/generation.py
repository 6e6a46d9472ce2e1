"""One engine request for one prompt's choices: route -> (prefill hop) -> dispatch, and migration.

`Generation.start` routes and dispatches an attempt; its replies land in the request's reply
queue, tagged with the attempt id (and each choice's engine index: the n choices of a prompt
go to the engine as one request with `n`, so the prompt is prefilled once). When an attempt
fails with a migratable fault (engine unreachable, stream cut or silent, engine overloaded),
`fail` re-routes excluding the instances that failed and resends prompt + the tokens generated
so far with max_tokens reduced: the engines are deterministic per context, so the client sees
one stream. Choices that already diverged go on as one request each (their contexts differ).
A constrained output (json_schema, regex, a required tool call) cannot go on that way: the
engine would start its grammar afresh after the resent tokens. It is regenerated from the
prompt when the engines give the same tokens again (greedy or seeded; the token loop checks
each and sends on only what is new). A sampled one raises CannotResume: the request starts
over from the prompt if the client has none of its output yet (endpoints.serve), and fails
otherwise: never a second grammar's output appended to the first's.
Migration is thus a loop around route -> stream, driven by the token loop. A fault that
cannot migrate, or the migration limit, raises EngineError.

A request the client does not stream is asked of the engine whole (`stream=False`: one final
message with every token, as smg and vLLM's own server ask), which spares the engine, the
dispatcher and this process the per-token work. Not when something needs the tokens as they
come: stop strings (matched here, and a match stops the engine early) and the prefill hop (the
decode leg's first token tells a failed KV transfer from a failed decode). A whole attempt
that fails restarts from the prompt. Silence is its normal state: the watchdog allows it the
longest a streamed attempt could take (first-token timeout + max_tokens x gap timeout); the
dispatcher's stall watch, the HTTP/2 keepalive, the fleet's health probes, the heartbeat to a
frozen dispatcher and the request's deadline end it sooner when they see a fault.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import msgspec

from switchyard.common import errors
from switchyard.common.errors import EngineError
from switchyard.preprocessor.dispatcher_client import GenerationStream, NoDispatcher
from switchyard.preprocessor.errors import NoWorker
from switchyard.preprocessor.prefill_hop import HopStream, open_hop, supported
from switchyard.preprocessor.reply_queue import ReplyQueue
from switchyard.preprocessor.router_client import FALLBACK_POLICY, KV_POLICY, route_around
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.protos.messages import (
    STAGE_FINISHED,
    STAGE_FIRST_TOKEN,
    GenerateFailed,
    GenerateRequest,
    Instance,
    RouteRequest,
    RouteResponse,
    SamplingParams,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from switchyard.preprocessor.tracing import Trace

log = logging.getLogger(__name__)


class CannotResume(EngineError):
    """A sampled constrained output failed after its first tokens: it cannot go on, nor come
    out the same again. The request may still start over from the prompt, on engines other
    than `exclude`, as attempt `attempt`, while the client has seen none of its output."""

    def __init__(
        self, kind: str, message: str, instance_id: int, exclude: list[int], attempt: int
    ) -> None:
        super().__init__(kind, message, instance_id)
        self.exclude = exclude
        self.attempt = attempt


class Generation:
    __slots__ = (
        "ctx",
        "choices",
        "prompt_ids",
        "base_id",
        "sampling",
        "attempt",
        "attempt_id",
        "instance_id",
        "stream",
        "exclude",
        "refused",
        "hops",
        "got_tokens",
        "whole",
        "last",
        "open",
        "unfinished",
        "prompt_logprobs",
        "prefill_instance_id",
        "predicted",
        "span",
        "first_span",
    )

    def __init__(
        self,
        ctx: RequestContext,
        choices: list[ChoiceOutput],
        prompt_ids: list[int],
        base_id: str,
        sampling: SamplingParams,
        prompt_logprobs: int | None = None,
    ) -> None:
        self.ctx = ctx
        self.choices = choices  # engine index i -> choices[i]
        self.prompt_ids = prompt_ids
        self.base_id = base_id  # the engine request id of the first attempt
        self.sampling = sampling
        self.attempt = 0
        self.attempt_id = base_id
        self.instance_id = 0
        self.stream: GenerationStream | HopStream | None = None
        self.exclude: list[int] = []
        # Engines that refused an attempt (a per-call UNAVAILABLE): avoided while another
        # can take it, tried again when none is left (a refusal is a moment, not a fault).
        self.refused: list[int] = []
        self.hops = 0
        self.got_tokens = False  # this attempt produced a token
        self.whole = False  # this attempt asked the engine for one final message
        self.last = 0.0  # loop time of this attempt's last reply (the watchdog reads it)
        self.open = False  # an attempt is running
        self.unfinished = len(choices)
        self.prompt_logprobs = prompt_logprobs  # echo: asked of the first attempt only
        self.prefill_instance_id: int | None = None  # the prefill engine of a hop
        # KV routing's prediction for the attempt: (cached tokens, block size); None when
        # the policy predicts nothing.
        self.predicted: tuple[int, int] | None = None
        self.span: Span | None = None  # tracing on: the attempt's dispatch span
        self.first_span: Span | None = None  # ... and its first_token span

    # ---- route -> hop -> dispatch ------------------------------------------------------

    async def start(self, last_failure: GenerateFailed | None = None) -> None:
        ctx = self.ctx
        deps = ctx.deps
        timer = deps.timer
        if self.attempt:
            self.attempt_id = f"{self.base_id}.m{self.attempt}"
        trace = ctx.state.trace
        t0 = time.perf_counter()
        span = None
        if trace is not None:
            span = trace.span("route", **{"switchyard.attempt": self.attempt})
        routed = await self._route(span)
        if timer is not None:
            timer.add("route", time.perf_counter() - t0)
        instance_id = routed.instance_id
        assert instance_id is not None
        self._predict(routed)
        choices = self.choices
        generated = choices[0].generated if len(choices) == 1 else []
        if generated and self.sampling.constraint is not None:
            # An engine starts a grammar afresh with each request: resent as prompt, the
            # output so far would be followed by a second instance of the constrained text.
            # The new attempt regenerates it from the prompt instead (checked token by token).
            choices[0].replay()
            generated = []
        # The prefill hop only before any token: a later migration resends the prompt and the
        # tokens so far to one worker, as without disaggregation.
        pair = self._hop_pair(routed) if not generated else None
        if pair is not None and self.hops >= deps.limits.hop_attempts:
            assert last_failure is not None
            raise EngineError(
                last_failure.kind,
                f"the prefill hop failed {self.hops} times: {last_failure.message}",
                last_failure.instance_id,
            )
        if pair is not None and len(choices) > 1:
            # The engines take no `n` with disaggregation: one request per choice.
            await self._split(choices[1:])
            choices = self.choices
        sampling = self.sampling
        if generated or sampling.n != len(choices):
            sampling = msgspec.structs.replace(
                sampling,
                n=len(choices),
                max_tokens=sampling.max_tokens - len(generated),
                min_tokens=max(0, sampling.min_tokens - len(generated)),
            )
        state = ctx.state
        whole = self.whole_unless_hop() and pair is None
        request = GenerateRequest(
            request_id=self.attempt_id,
            instance_id=instance_id,
            token_ids=self.prompt_ids + generated if generated else self.prompt_ids,
            sampling=sampling,
            logprobs=state.logprobs,
            prompt_logprobs=None if self._prompt_logprobs_in() else self.prompt_logprobs,
            reasoning=state.reasoning,
            data_parallel_rank=routed.dp_rank,  # the rank the router chose (None: the engine's)
            http_request_id=ctx.inp.request_id,
            stream=not whole,
        )
        if trace is not None:
            request = self._dispatch_span(trace, request, routed, pair)
        self.instance_id = instance_id
        self.got_tokens = False
        self.whole = whole
        self.unfinished = sum(1 for c in choices if not c.done)
        state.attempts[self.attempt_id] = self
        t0 = time.perf_counter()
        if pair is not None:
            self.hops += 1
            self.prefill_instance_id = pair[0].instance_id
            hop = trace.span("prefill_hop", self.span) if trace is not None else None
            self.stream = await open_hop(
                self._open,
                request,
                *pair,
                deps.limits.first_token_timeout,
                state.queue,
                deps.metrics.internal_error,
            )
            if hop is not None:
                hop.end()
            stage = "hop"
        else:
            self.stream = await self._open(request, state.queue)
            stage = "dispatch"
        if timer is not None:
            timer.add(stage, time.perf_counter() - t0)
        self.open = True
        self.last = asyncio.get_running_loop().time()

    def _prompt_logprobs_in(self) -> bool:
        """The echo's prompt logprobs came (with the first reply): a later attempt's prompt
        holds output tokens too, and must not ask for them again."""
        return any(
            c.completion_logprobs is not None and c.completion_logprobs.tokens
            for c in self.choices
        )

    async def _split(self, others: list[ChoiceOutput]) -> None:
        """Serve `others` from one new generation each; this one keeps the rest."""
        self.choices = [c for c in self.choices if c not in others]
        for choice in others:
            sibling = Generation(
                self.ctx,
                [choice],
                self.prompt_ids,
                f"{self.base_id}.c{choice.index}",
                self.sampling,
                self.prompt_logprobs,
            )
            sibling.attempt = self.attempt
            sibling.exclude = list(self.exclude)
            sibling.refused = list(self.refused)
            sibling.hops = self.hops
            self.ctx.state.generations.append(sibling)
            await sibling.start()

    def _dispatch_span(
        self,
        trace: Trace,
        request: GenerateRequest,
        routed: RouteResponse,
        pair: tuple[Instance, Instance] | None,
    ) -> GenerateRequest:
        """Start the attempt's dispatch and first_token spans; the request then carries the
        dispatch span's context to the engine."""
        instance = self.ctx.deps.instances().get(request.instance_id)
        span = self.span = trace.span(
            "dispatch",
            **{
                "switchyard.engine_request_id": request.request_id,
                "switchyard.worker": instance.url if instance is not None else "",
                "switchyard.attempt": self.attempt,
                "switchyard.prefill_worker": pair[0].url if pair is not None else "",
            },
        )
        self.first_span = trace.span("first_token", span)
        return msgspec.structs.replace(request, traceparent=trace.traceparent(span))

    def _predict(self, routed: RouteResponse) -> None:
        """Keep what the KV router predicted of this attempt's cached prefix."""
        self.predicted = None
        if routed.policy != KV_POLICY or routed.instance_id is None:
            return
        instance = self.ctx.deps.instances().get(routed.instance_id)
        if instance is not None:
            block = instance.block_size
            self.predicted = (min(routed.overlap_blocks * block, len(self.prompt_ids)), block)

    def whole_unless_hop(self) -> bool:
        """The attempt asks the engine for one final message, unless it goes through a hop."""
        req = self.ctx.inp.request
        return self.ctx.deps.limits.whole_replies and not (req.stream or req.sampling.stop)

    async def _route(self, span: Span | None = None) -> RouteResponse:
        ctx = self.ctx
        deps = ctx.deps
        request = RouteRequest(
            request_id=self.attempt_id,
            model=ctx.inp.request.model,
            token_ids=self.prompt_ids,
            exclude=self.exclude,
            session_id=ctx.inp.session_id,
            whole=self.whole_unless_hop(),
        )
        reply = await route_around(deps.router, request, deps.limits.route_timeout, self.refused)
        if reply.policy == FALLBACK_POLICY:
            deps.metrics.router_fallback.inc()
        if span is not None:
            span.set_attributes(
                {
                    "switchyard.policy": reply.policy,
                    "switchyard.instance_id": reply.instance_id or 0,
                    "switchyard.overlap_blocks": reply.overlap_blocks,
                    "switchyard.prompt_blocks": reply.prompt_blocks,
                }
            )
            if reply.instance_id is None:
                ctx.state.trace.fail(  # type: ignore[union-attr]
                    span, reply.error or "no_worker", "no engine available"
                )
            else:
                span.end()
        if reply.instance_id is None:
            model = ctx.inp.request.model
            raise NoWorker(reply.error, f"no engine available for model {model!r}", model)
        return reply

    def _hop_pair(self, reply: RouteResponse) -> tuple[Instance, Instance] | None:
        if reply.prefill_instance_id is None or reply.instance_id is None:
            return None
        known = self.ctx.deps.instances()
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

    async def _open(self, request: GenerateRequest, queue: ReplyQueue | None) -> GenerationStream:
        try:  # waits (bounded) for a replica while the only dispatcher restarts
            return await self.ctx.deps.dispatcher.open(request, queue)
        except NoDispatcher as exc:
            raise NoWorker("no_dispatcher", str(exc)) from None

    # ---- what the token loop reports --------------------------------------------------

    async def first_token_sent(self) -> None:
        """The client has this attempt's first token: the router frees its prefill booking."""
        if self.first_span is not None:
            self.first_span.end()
            self.first_span = None
        await self.ctx.deps.router.progress(
            self.attempt_id, self.instance_id, STAGE_FIRST_TOKEN, final=False
        )

    async def finished(self) -> None:
        """The engine sent its final message for every choice of this attempt."""
        if self.stream is not None:
            self.stream.close()
        await self._end()

    async def stop(self) -> None:
        """The request no longer needs this attempt (stop strings, client gone, error)."""
        if self.open and self.stream is not None:
            await self.stream.cancel()
        await self._end()

    def _end_spans(self, failure: GenerateFailed | None = None) -> None:
        trace = self.ctx.state.trace
        assert trace is not None
        for span in (self.first_span, self.span):
            if span is None:
                continue
            if failure is not None:
                trace.fail(span, failure.kind, failure.message)
            else:
                span.end()
        self.first_span = self.span = None

    async def _end(self) -> None:
        if self.span is not None:
            self._end_spans()
        if not self.open:
            return
        self.open = False
        self.ctx.state.attempts.pop(self.attempt_id, None)
        await self.ctx.deps.router.progress(
            self.attempt_id, self.instance_id, STAGE_FINISHED, final=True
        )

    async def fail(self, failure: GenerateFailed) -> None:
        """An attempt failed: migrate it (a new attempt is running on return) or raise."""
        if isinstance(self.stream, HopStream):
            failure = self.stream.blame(failure)
        if self.span is not None:
            self._end_spans(failure)
        await self.stop()
        deps = self.ctx.deps
        if failure.kind not in errors.MIGRATABLE:
            raise EngineError(failure.kind, failure.message, failure.instance_id)
        if failure.kind == errors.OVERLOADED:
            await deps.router.busy(failure.instance_id, deps.limits.busy_seconds)
        if failure.kind == errors.REFUSED:
            self.refused.append(failure.instance_id)
        elif failure.engine_fault:
            self.exclude.append(failure.instance_id)
        if self.attempt >= deps.limits.migration_limit:
            raise EngineError(
                failure.kind,
                f"gave up after {deps.limits.migration_limit} migrations: {failure.message}",
                failure.instance_id,
            )
        left = [c for c in self.choices if not c.done]
        if self.sampling.constraint is not None and not _repeatable(self.sampling):
            so_far = max((len(c.generated) for c in left), default=0)
            if so_far:
                deps.metrics.migrations.labels(self._model(), failure.kind).inc()
                raise CannotResume(
                    failure.kind,
                    f"{failure.message}; the constrained output was {so_far} tokens in and, "
                    "sampled (temperature > 0, no seed), cannot be regenerated the same on "
                    "another engine",
                    failure.instance_id,
                    self.exclude,
                    self.attempt + 1,
                )
        log.warning(
            "migrating request_id=%s from instance_id=%d kind=%s after %d tokens: %s",
            self.base_id,
            failure.instance_id,
            failure.kind,
            sum(len(c.generated) for c in left),
            failure.message,
            extra={"request_id": self.ctx.inp.request_id},
        )
        state = self.ctx.state
        deps.metrics.migrations.labels(self._model(), failure.kind).inc()
        state.migrations += 1
        self.attempt += 1
        trace = state.trace
        span = None
        if trace is not None:
            span = trace.span(
                "migration",
                **{
                    "switchyard.kind": failure.kind,
                    "switchyard.from_instance_id": failure.instance_id,
                    "switchyard.attempt": self.attempt,
                    "switchyard.tokens_so_far": sum(len(c.generated) for c in left),
                },
            )
        if len(left) > 1 and any(c.generated for c in left):
            self.choices = left
            await self._split(left[1:])  # each diverged choice resumes on its own
        else:
            self.choices = left
        try:
            await self.start(failure)
        except BaseException as exc:
            if trace is not None and span is not None:
                trace.fail(span, type(exc).__name__, str(exc))
            raise
        if span is not None:
            span.end()

    def _model(self) -> str:
        entry = self.ctx.state.entry
        return entry.name if entry is not None else ""

    def diverged(self, choice: ChoiceOutput) -> EngineError:
        """A regenerated constrained output that came out other than the output so far."""
        return EngineError(
            errors.DISCONNECTED,
            f"the engine failed {len(choice.generated)} tokens into a constrained output, "
            "and regenerating it on another engine gave other tokens",
            self.instance_id,
        )

    def silent(self, timeout: float) -> GenerateFailed:
        """The failure of an attempt the watchdog found silent for `timeout` seconds."""
        if self.whole:
            what = f"to a whole request of at most {self.sampling.max_tokens} tokens"
        else:
            what = "between tokens" if self.got_tokens else "before the first token"
        return GenerateFailed(
            request_id=self.attempt_id,
            instance_id=self.instance_id,
            kind=errors.DISCONNECTED,
            message=f"no reply for {timeout:g}s {what}",
        )


def _repeatable(sampling: SamplingParams) -> bool:
    """The engines give the same tokens again for the same context (greedy, or seeded)."""
    return sampling.temperature == 0 or sampling.top_k == 1 or sampling.seed is not None
