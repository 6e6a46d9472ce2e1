"""The migration policy: what a failed engine request means for the request it served.

One policy for every kind of engine request (chat, completions, Responses, embeddings, and
the prefill hop of a disaggregated one); `lifecycle` and `embed` apply it to each failure:

- A fault that cannot migrate (a bad request, an engine error, a cancel) fails the request.
- An engine that answered RESOURCE_EXHAUSTED is marked busy at the routers for a while.
- An engine that refused the call (a per-call UNAVAILABLE over a live connection) is avoided
  while another can take the request and tried again when none is left (`Placement.refused`,
  see router_client.route_around); an engine at fault (down, cut, silent) is excluded from
  the request's later attempts (`Placement.exclude`); a fault that is not the engine's (a
  dispatcher that went away) excludes nothing.
- Past `--migration-limit` attempts the request fails ("gave up after N migrations").
- Otherwise the request migrates: its next attempt resends the prompt and the output so far
  (`MIGRATE`). An output that cannot go on that way, nor come out the same again (a sampled
  constrained output some tokens in, see `resumable`), starts over from the prompt instead:
  `CannotResume` is the verdict, and the request starts over if the client has none of its
  output yet, and fails otherwise.
- The prefill hop is retried `hop_attempts` times in all (`check_hop`); after that the
  request fails rather than trying yet another pair of engines.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from switchyard.common import errors
from switchyard.common.errors import EngineError
from switchyard.preprocessor.stages.context import Deps, RequestContext
from switchyard.protos.messages import GenerateFailed, SamplingParams


@dataclass(slots=True)
class Placement:
    """Where the next attempt of an engine request may go, and how many it had."""

    attempt: int = 0  # the attempt number (0: the first; each migration adds one)
    exclude: list[int] = field(default_factory=list)  # engines at fault: never again
    refused: list[int] = field(default_factory=list)  # engines that refused: avoided
    hops: int = 0  # prefill hops tried

    def copy(self) -> Placement:
        return dataclasses.replace(self, exclude=list(self.exclude), refused=list(self.refused))


class CannotResume(EngineError):
    """A sampled constrained output failed after its first tokens: it cannot go on, nor come
    out the same again. The request may start over from the prompt, placed as `placement`
    says, while the client has seen none of its output."""

    def __init__(self, failure: GenerateFailed, message: str, placement: Placement) -> None:
        super().__init__(failure.kind, message, failure.instance_id)
        self.placement = placement


def resumable(sampling: SamplingParams) -> bool:
    """An output can go on on another engine from what it has so far: unconstrained (resent
    as prompt, it is simply continued), or constrained but coming out the same again
    (greedy, or seeded: it is regenerated from the prompt and checked token by token). An
    engine starts a grammar afresh with each request, so a sampled constrained output cannot."""
    if sampling.constraint is None:
        return True
    return sampling.temperature == 0 or sampling.top_k == 1 or sampling.seed is not None


async def judge(
    ctx: RequestContext,
    placement: Placement,
    failure: GenerateFailed,
    output_so_far: int = 0,
    can_resume: bool = True,
) -> CannotResume | None:
    """Apply the policy to a failed attempt: raises EngineError when the request fails;
    returns None when it migrates (`placement` then places its next attempt), a CannotResume
    when it can only start over from the prompt. `output_so_far`: the most tokens a choice
    of the attempt had; `can_resume`: see `resumable`."""
    if failure.kind not in errors.MIGRATABLE:
        raise EngineError(failure.kind, failure.message, failure.instance_id)
    deps = ctx.deps
    if failure.kind == errors.OVERLOADED:
        await deps.router.busy(failure.instance_id, deps.limits.busy_seconds)
    if failure.kind == errors.REFUSED:
        placement.refused.append(failure.instance_id)
    elif failure.engine_fault:
        placement.exclude.append(failure.instance_id)
    limit = deps.limits.migration_limit
    if placement.attempt >= limit:
        raise EngineError(
            failure.kind,
            f"gave up after {limit} migrations: {failure.message}",
            failure.instance_id,
        )
    entry = ctx.entry
    deps.metrics.migrations.labels(entry.name if entry is not None else "", failure.kind).inc()
    ctx.migrations += 1
    placement.attempt += 1
    if output_so_far and not can_resume:
        return CannotResume(
            failure,
            f"{failure.message}; the constrained output was {output_so_far} tokens in and, "
            "sampled (temperature > 0, no seed), cannot be regenerated the same on another "
            "engine",
            placement.copy(),
        )
    return None


def check_hop(deps: Deps, placement: Placement, last_failure: GenerateFailed | None) -> None:
    """Before another prefill hop: raises EngineError once the hop failed `hop_attempts`
    times (the failures are the prefill side's, see prefill_hop.HopStream.blame)."""
    if placement.hops < deps.limits.hop_attempts:
        return
    assert last_failure is not None  # a hop failed before: its failure is the last
    raise EngineError(
        last_failure.kind,
        f"the prefill hop failed {placement.hops} times: {last_failure.message}",
        last_failure.instance_id,
    )
