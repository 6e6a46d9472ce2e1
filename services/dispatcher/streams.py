"""Run one generation on an engine and turn it into neutral replies for the caller.

`run_generation` is the per-request hot path: token deltas go out as they arrive; a failure
becomes one GenerateFailed with its kind; cancellation aborts the request on the engine.
Whatever goes wrong, the caller gets a final reply: a channel closed under the stream is
kind `disconnected` (migrate at once), an exception nobody foresaw becomes kind
`engine_error` (logged once with its traceback and counted), never a silent task death that
leaves the client waiting for the idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from switchyard.common import errors
from switchyard.common.engines.base import EngineClient
from switchyard.common.engines.http2 import Relay
from switchyard.common.errors import EngineError
from switchyard.protos.messages import GenerateFailed, GenerateRequest

log = logging.getLogger(__name__)

Send = Callable[[object], None]  # queues a reply for the caller (never waits)


async def run_generation(
    client: EngineClient,
    request: GenerateRequest,
    send: Send,
    on_instance_down: Callable[[int, str, str], None],
    on_error: Callable[[str], None] | None = None,
    on_first_token: Callable[[float], None] | None = None,
    relay: Relay | None = None,
) -> None:
    """`on_first_token(seconds)`: the engine's time to its first reply, once. `relay`: plain
    token chunks may go straight into its batch (EngineClient.stream_into), the rest to
    `send`; both end up in the same batch, in the engine's order."""
    try:
        if on_first_token is None:
            await client.stream_into(request, send, relay)
        else:
            started = time.perf_counter()
            timed = False

            def first() -> None:
                nonlocal timed
                if not timed:
                    timed = True
                    on_first_token(time.perf_counter() - started)

            def emit(event: object) -> None:
                if not timed:
                    first()
                send(event)

            if relay is not None:
                relay.on_first = first
            await client.stream_into(request, emit, relay)
    except asyncio.CancelledError:
        # The caller went away: tell the engine to drop the request, without waiting on it.
        with contextlib.suppress(EngineError):
            await asyncio.shield(client.abort(request.request_id))
        raise
    except EngineError as exc:
        log.warning(
            "generation failed request_id=%s instance_id=%d kind=%s: %s",
            request.request_id,
            request.instance_id,
            exc.kind,
            exc.message,
            extra={"request_id": request.request_id},
        )
        _fail(request, exc.kind, exc.message, send, on_error)
        if exc.kind in errors.INSTANCE_DOWN:
            on_instance_down(request.instance_id, exc.kind, exc.message)
    except Exception as exc:
        if client.closed:  # whatever the channel raised once closed: the stream moves on
            _fail(request, errors.DISCONNECTED, f"the channel was closed: {exc}", send, on_error)
            return
        log.exception(
            "generation failed unexpectedly request_id=%s instance_id=%d",
            request.request_id,
            request.instance_id,
            extra={"request_id": request.request_id},
        )
        message = f"internal error in the dispatcher: {type(exc).__name__}: {exc}"
        _fail(request, errors.ENGINE_ERROR, message, send, on_error)


def _fail(
    request: GenerateRequest,
    kind: str,
    message: str,
    send: Send,
    on_error: Callable[[str], None] | None,
) -> None:
    if on_error is not None:
        on_error(kind)
    send(
        GenerateFailed(
            request_id=request.request_id,
            instance_id=request.instance_id,
            kind=kind,
            message=message,
        )
    )
