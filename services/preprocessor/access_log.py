"""The access log: one INFO line per API request, on logger `switchyard.access`.

    POST /v1/chat/completions request_id=chatcmpl-1f.. model=m route=/v1/chat/completions
      worker=grpc://10.0.0.7:30000 prefill_worker=- status=200 stream=true prompt_tokens=412
      cached_tokens=384 completion_tokens=64 ttft_ms=31.2 total_ms=402.5 migrations=0
      client_disconnect=false error=-

(one line; with `--log-format json` the same fields are JSON keys). `worker` is the engine
that produced the output (several, comma-separated, when the choices of a request ran on
different engines); `prefill_worker` the prefill engine of a disaggregated request. Failed
requests are logged too, with their `error` code; `ttft_ms` is empty for a request asked of
the engine whole (not streamed: no token comes before the last); a client that left before
its answer was complete has status 499 and client_disconnect=true. Off with
`--no-access-log`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from switchyard.preprocessor.stages.context import RequestContext
from switchyard.protos.messages import Instance

log = logging.getLogger("switchyard.access")

CLIENT_GONE = 499


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def request_fields(
    ctx: RequestContext, status: int, instances: Mapping[int, Instance], now: float
) -> dict[str, Any]:
    """What the access line (and the request's trace) says about one request."""
    inp = ctx.inp
    request = ctx.body
    fields: dict[str, Any] = {"request_id": inp.request_id}
    if request is None:  # the body never parsed
        fields.update(model=None, route=inp.path, status=status, error=ctx.error or None)
        return fields
    workers: list[str] = []
    prefill: list[str] = []
    for gen in ctx.generations:
        att = gen.attempt
        if att is None:
            continue
        _add(workers, instances, att.instance_id)
        if att.prefill_instance_id is not None:
            _add(prefill, instances, att.prefill_instance_id)
    if inp.endpoint == "embeddings":
        _add(workers, instances, ctx.extra.get("instance_id"))
    usage = ctx.usage
    prompt = usage.prompt_tokens if usage else sum(len(ids) for ids in ctx.prompt_ids)
    completion = usage.completion_tokens if usage else sum(len(c.generated) for c in ctx.choices)
    first = ctx.first_token_at
    fields.update(
        model=request.model,
        route=inp.path,
        worker=",".join(workers) or None,
        prefill_worker=",".join(prefill) or None,
        status=status,
        stream=bool(getattr(request, "stream", False)),
        prompt_tokens=prompt,
        cached_tokens=usage.cached_tokens if usage else None,
        completion_tokens=completion,
        ttft_ms=_ms(first - inp.received if first is not None else None),
        total_ms=_ms(now - inp.received),
        migrations=ctx.migrations,
        client_disconnect=status == CLIENT_GONE,
        error=ctx.error or None,
    )
    return fields


def _add(out: list[str], instances: Mapping[int, Instance], instance_id: int | None) -> None:
    if not instance_id:
        return
    instance = instances.get(instance_id)
    url = instance.url if instance is not None else f"instance:{instance_id}"
    if url not in out:
        out.append(url)


class AccessLog:
    def __init__(self, instances: Callable[[], Mapping[int, Instance]]) -> None:
        self._instances = instances

    def write(self, method: str, ctx: RequestContext, status: int) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        fields = request_fields(ctx, status, self._instances(), time.perf_counter())
        log.info("%s %s", method, ctx.inp.path, extra={"fields": fields})
