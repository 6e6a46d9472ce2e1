"""Run one embed request: every input through the engine's Embed RPC at once, one reply.

The engines embed one input per call, so an EmbedRequest with N inputs makes N concurrent
calls (request ids `<id>-<i>` when N > 1) and answers one Embeddings with the vectors in input
order, or one GenerateFailed with the first failure's kind (the other calls are cancelled).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from switchyard.common import errors
from switchyard.common.engines.base import Embedding, EngineClient, call_metadata
from switchyard.common.errors import EngineError
from switchyard.protos.messages import Embeddings, EmbedRequest, GenerateFailed

log = logging.getLogger(__name__)

Send = Callable[[object], None]


def _sub_id(request: EmbedRequest, index: int) -> str:
    return request.request_id if len(request.inputs) == 1 else f"{request.request_id}-{index}"


async def _embed_all(client: EngineClient, request: EmbedRequest) -> list[Embedding]:
    if not request.inputs:
        raise EngineError(errors.BAD_REQUEST, "an embed request needs at least one input")
    metadata = call_metadata(request.http_request_id, request.traceparent)
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(client.embed(_sub_id(request, i), ids, metadata=metadata))
                for i, ids in enumerate(request.inputs)
            ]
    except* EngineError as failed:
        raise failed.exceptions[0] from None
    results = [task.result() for task in tasks]
    dimensions = {result.dimensions for result in results}
    if len(dimensions) != 1:
        raise EngineError(errors.ENGINE_ERROR, f"the engine mixed dimensions {sorted(dimensions)}")
    return results


async def run_embed(
    client: EngineClient,
    request: EmbedRequest,
    send: Send,
    on_instance_down: Callable[[int, str, str], None],
    on_error: Callable[[str], None] | None = None,
) -> None:
    try:
        results = await _embed_all(client, request)
    except EngineError as exc:
        log.warning(
            "embed failed request_id=%s instance_id=%d kind=%s: %s",
            request.request_id,
            request.instance_id,
            exc.kind,
            exc.message,
            extra={"request_id": request.request_id},
        )
        if on_error is not None:
            on_error(exc.kind)
        if exc.kind in errors.INSTANCE_DOWN:
            on_instance_down(request.instance_id, exc.kind, exc.message)
        send(
            GenerateFailed(
                request_id=request.request_id,
                instance_id=request.instance_id,
                kind=exc.kind,
                message=exc.message,
            )
        )
        return
    send(
        Embeddings(
            request_id=request.request_id,
            dimensions=results[0].dimensions,
            vectors=[result.vector for result in results],
            prompt_tokens=sum(result.prompt_tokens for result in results),
        )
    )
