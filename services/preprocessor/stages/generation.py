"""One prompt's choices over their engine requests: the `Generation` holds what every
attempt shares (the choices, prompt, sampling, lineage, placement) and builds each engine
request; an `Attempt` is one engine request sent (its engine, stream and progress: lifecycle.py
moves it from phase to phase).

The n choices of a prompt go to the engine as one request with `n`, so the prompt is
prefilled once; replies are matched to a choice by the engine index. Choices that must go on
apart (their outputs diverged before a migration, or a prefill hop, which takes no `n`) are
split off into a generation each.

Lineage is kept in fields, not parsed out of ids: `group` (the prompt of a completions
batch), `split` (the choice split off, -1: none), `restart` (the request's start-overs) and
`placement.attempt` (its migrations). `engine_request_id` renders them into the id the
engine sees: `<id>[.p<group>][.s<restart>][.c<choice>][.m<attempt>]`.

A request the client does not stream is asked of the engine whole (`stream=False`: one final
message with every token, as smg and vLLM's own server ask), which spares the engine, the
dispatcher and this process the per-token work. Not when something needs the tokens as they
come: stop strings (matched here, and a match stops the engine early) and the prefill hop
(the decode leg's first token tells a failed KV transfer from a failed decode).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from switchyard.common import errors
from switchyard.common.errors import EngineError
from switchyard.preprocessor.router_client import KV_POLICY
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.preprocessor.stages.migration import Placement
from switchyard.protos.messages import (
    GenerateFailed,
    GenerateRequest,
    RouteResponse,
    SamplingParams,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from switchyard.preprocessor.dispatcher_client import GenerationStream
    from switchyard.preprocessor.prefill_hop import HopStream

# Phases of an attempt (lifecycle.py owns the transitions); a generation not started yet
# has no attempt.
ROUTE = "route"  # asking the router
HOP = "hop"  # opening a prefill hop
DISPATCH = "dispatch"  # opening the engine request
STREAM = "stream"  # replies flow into the request's queue
DONE = "done"  # the engine request ended (finished, or no longer needed)
FAILED = "failed"  # the attempt failed: the migration policy decides what follows


def engine_request_id(prefix: str, group: int, split: int, restart: int, attempt: int) -> str:
    rid = prefix
    if group:
        rid += f".p{group}"
    if restart:
        rid += f".s{restart}"
    if split >= 0:
        rid += f".c{split}"
    if attempt:
        rid += f".m{attempt}"
    return rid


class Attempt:
    """One engine request of a generation: the engine it went to, its stream, how far it got.
    A migration or a start-over makes a new one; the last one stays for the request's logs
    and metrics (its engines, the KV router's prediction)."""

    __slots__ = (
        "gen",
        "id",
        "phase",
        "instance_id",
        "prefill_instance_id",
        "stream",
        "live",
        "got_tokens",
        "whole",
        "last",
        "predicted",
        "span",
        "first_span",
    )

    def __init__(
        self,
        gen: Generation,
        attempt_id: str,
        instance_id: int,
        whole: bool,
        predicted: tuple[int, int] | None,
    ) -> None:
        self.gen = gen
        self.id = attempt_id  # the engine request id
        self.phase = ROUTE
        self.instance_id = instance_id
        self.prefill_instance_id: int | None = None  # the prefill engine of a hop
        self.stream: GenerationStream | HopStream | None = None
        self.live = False  # an engine request is open: to cancel, and to tell the router of
        self.got_tokens = False  # it produced a token
        self.whole = whole  # it asked the engine for one final message
        self.last = 0.0  # loop time of its last reply (the watchdog reads it)
        # KV routing's prediction: (cached tokens, block size); None when the policy
        # predicts nothing.
        self.predicted = predicted
        self.span: Span | None = None  # tracing on: its dispatch span
        self.first_span: Span | None = None  # ... and its first_token span

    def silent(self, timeout: float) -> GenerateFailed:
        """Its failure, found silent for `timeout` seconds by the watchdog."""
        if self.whole:
            what = f"to a whole request of at most {self.gen.sampling.max_tokens} tokens"
        else:
            what = "between tokens" if self.got_tokens else "before the first token"
        return GenerateFailed(
            request_id=self.id,
            instance_id=self.instance_id,
            kind=errors.DISCONNECTED,
            message=f"no reply for {timeout:g}s {what}",
        )


class Generation:
    __slots__ = (
        "ctx",
        "choices",
        "prompt_ids",
        "sampling",
        "prompt_logprobs",
        "group",
        "split",
        "restart",
        "placement",
        "unfinished",
        "attempt",
    )

    def __init__(
        self,
        ctx: RequestContext,
        choices: list[ChoiceOutput],
        prompt_ids: list[int],
        sampling: SamplingParams,
        prompt_logprobs: int | None = None,
        *,
        group: int = 0,
        split: int = -1,
        placement: Placement | None = None,
    ) -> None:
        self.ctx = ctx
        self.choices = choices  # engine index i -> choices[i]
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.prompt_logprobs = prompt_logprobs  # echo: asked until they came
        self.group = group
        self.split = split
        self.restart = ctx.restarts
        self.placement = placement if placement is not None else Placement()
        self.unfinished = len(choices)
        self.attempt: Attempt | None = None  # the current (or last) attempt; None: not started

    def next_id(self) -> str:
        """The engine request id of the attempt about to start."""
        return engine_request_id(
            self.ctx.inp.engine_id, self.group, self.split, self.restart, self.placement.attempt
        )

    def sibling(self, choice: ChoiceOutput) -> Generation:
        """A generation of its own for `choice`, placed as this one."""
        return Generation(
            self.ctx,
            [choice],
            self.prompt_ids,
            self.sampling,
            self.prompt_logprobs,
            group=self.group,
            split=choice.index,
            placement=self.placement.copy(),
        )

    def whole_unless_hop(self) -> bool:
        """The attempt asks the engine for one final message, unless it goes through a hop."""
        req = self.ctx.request
        return self.ctx.deps.limits.whole_replies and not (req.stream or req.sampling.stop)

    def left(self) -> list[ChoiceOutput]:
        return [c for c in self.choices if not c.done]

    def resume_ids(self) -> list[int]:
        """The output so far, to resend after the prompt ([] for a first attempt, several
        choices, or a constrained output, which is regenerated from the prompt instead: an
        engine would start its grammar afresh after it)."""
        choices = self.choices
        generated = choices[0].generated if len(choices) == 1 else []
        if generated and self.sampling.constraint is not None:
            choices[0].replay()
            return []
        return generated

    def predict(self, routed: RouteResponse) -> tuple[int, int] | None:
        """What the KV router predicted of an attempt's cached prefix (cached tokens, block
        size); None when its policy predicts nothing."""
        if routed.policy != KV_POLICY or routed.instance_id is None:
            return None
        instance = self.ctx.deps.instances().get(routed.instance_id)
        if instance is None:
            return None
        block = instance.block_size
        return min(routed.overlap_blocks * block, len(self.prompt_ids)), block

    def request(
        self, attempt_id: str, routed: RouteResponse, generated: list[int], whole: bool
    ) -> GenerateRequest:
        """The engine request of the attempt about to start (routed as `routed`)."""
        sampling = self.sampling
        n = len(self.choices)
        if generated or sampling.n != n:
            sampling = msgspec.structs.replace(
                sampling,
                n=n,
                max_tokens=sampling.max_tokens - len(generated),
                min_tokens=max(0, sampling.min_tokens - len(generated)),
            )
        assert routed.instance_id is not None
        return GenerateRequest(
            request_id=attempt_id,
            instance_id=routed.instance_id,
            token_ids=self.prompt_ids + generated if generated else self.prompt_ids,
            sampling=sampling,
            logprobs=self.ctx.logprobs,
            prompt_logprobs=None if self._prompt_logprobs_in() else self.prompt_logprobs,
            reasoning=self.ctx.reasoning,
            data_parallel_rank=routed.dp_rank,  # the rank the router chose (None: the engine's)
            http_request_id=self.ctx.inp.request_id,
            stream=not whole,
        )

    def _prompt_logprobs_in(self) -> bool:
        """The echo's prompt logprobs came (with the first reply): a later attempt's prompt
        holds output tokens too, and must not ask for them again."""
        return any(
            c.completion_logprobs is not None and c.completion_logprobs.tokens for c in self.choices
        )

    def diverged(self, choice: ChoiceOutput) -> EngineError:
        """A regenerated constrained output that came out other than the output so far."""
        assert self.attempt is not None
        return EngineError(
            errors.DISCONNECTED,
            f"the engine failed {len(choice.generated)} tokens into a constrained output, "
            "and regenerating it on another engine gave other tokens",
            self.attempt.instance_id,
        )
