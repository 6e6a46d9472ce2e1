"""The `admit` stage: the deployment's flow gate decides when the request runs (flow control,
`--flow-config`), between `check` (its prompts and budget known) and `generate`.

The request's flow, priority and TTFT objective come from flow_policy; what it costs the
gate: units = the sequences the engines will run (prompts x n; one embeddings call), cost =
tokens (every prompt, plus max_tokens per sequence). It waits here, queued, until admitted,
or fails with a 429 (Retry-After; code `rate_limit_exceeded`, or `ttft_objective_unattainable`
when its objective is out of reach) and the gate's reason. Its own deadline bounds the wait
(504 past it). `release` (from endpoints.serve, whatever happened) frees its units, with the
tokens it really used.

Without flow control the stage only refuses what would otherwise be dropped: a nonzero
`priority`, an `x-priority` or `x-ttft-objective-ms` header.
"""

from __future__ import annotations

import time

from switchyard.preprocessor import flow_policy
from switchyard.preprocessor.errors import (
    DeadlineExceededError,
    RateLimitError,
    ServiceUnavailableError,
)
from switchyard.preprocessor.stages.context import EMBEDDINGS, RequestContext
from switchyard.protos.messages import FlowAdmit

TTFT_OBJECTIVE = "ttft_objective"
OBJECTIVE_CODE = "ttft_objective_unattainable"
RETRY_AFTER_MAX_S = 60
TICKET_SUFFIX = "#flow"


def _cost(ctx: RequestContext) -> tuple[int, int]:
    """(units, tokens) of the request."""
    prompts = ctx.prompt_ids
    tokens = sum(len(p) for p in prompts)
    if ctx.inp.endpoint == EMBEDDINGS or ctx.sampling is None:
        return 1, max(1, tokens)
    units = max(1, len(prompts)) * max(1, ctx.sampling.n)
    return units, tokens + units * ctx.sampling.max_tokens


async def admit(ctx: RequestContext) -> None:
    deps, inp = ctx.deps, ctx.inp
    flow = deps.flow
    request = ctx.request
    asked = flow_policy.resolve(
        flow.config if flow is not None else None,
        inp.tenant,
        inp.headers,
        getattr(request, "priority", None),
    )
    if flow is None or asked is None:
        return
    received = inp.received
    elapsed = time.perf_counter() - received
    units, cost = _cost(ctx)
    objective_ms = 0.0
    if asked.objective_ms:
        objective_ms = asked.objective_ms - elapsed * 1e3
        if objective_ms <= 0:
            raise _limited(
                f"The request spent its TTFT objective of {asked.objective_ms:g} ms before "
                "reaching the flow gate.",
                1.0,
                OBJECTIVE_CODE,
            )
    max_wait = max(0.0, inp.timeout - elapsed) if inp.timeout else 0.0
    message = FlowAdmit(
        ticket=inp.engine_id + TICKET_SUFFIX,
        peer=flow.peer,
        model=request.model,
        flow=asked.flow,
        priority=asked.priority,
        units=units,
        cost=cost,
        objective_ms=objective_ms,
        token_ids=ctx.prompt_ids[0] if objective_ms and ctx.prompt_ids else [],
        max_wait_s=max_wait,
        config=flow.config.digest,
    )
    ctx.flow_ticket = message.ticket  # released by serve, admitted or not
    started = time.perf_counter()
    decision = await flow.admit(message)
    labels = (flow.config.priority_label(asked.priority), flow.config.flow_label(asked.flow))
    metrics = deps.metrics
    if decision.admitted:
        metrics.flow_wait.labels(*labels).observe(time.perf_counter() - started)
        return
    ctx.flow_ticket = None
    metrics.flow_refused.labels(*labels, decision.reason or "refused").inc()
    if inp.timeout and time.perf_counter() - received >= inp.timeout:
        raise DeadlineExceededError(inp.timeout)
    if decision.reason == TTFT_OBJECTIVE:
        raise _limited(decision.message, decision.retry_after_s, OBJECTIVE_CODE)
    if decision.reason in ("queue_full", "queue_timeout", "flow_limit"):
        raise _limited(decision.message, decision.retry_after_s)
    raise ServiceUnavailableError(decision.message or "The flow gate refused the request.")


def release(ctx: RequestContext) -> None:
    """The request is over: its gate frees its units (refunding what it did not use)."""
    ticket = ctx.flow_ticket
    flow = ctx.deps.flow
    if ticket is None or flow is None:
        return
    ctx.flow_ticket = None
    usage = ctx.usage
    used = usage.prompt_tokens + usage.completion_tokens if usage is not None else -1
    flow.release(ticket, used)


def _limited(
    message: str, retry_after_s: float, code: str = "rate_limit_exceeded"
) -> RateLimitError:
    retry = max(1, min(RETRY_AFTER_MAX_S, int(retry_after_s + 0.999)))
    return RateLimitError(message, retry, code)
