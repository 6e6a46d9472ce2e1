"""The request path after tokenization: route -> dispatch -> stream -> (migrate on fault).

`Pipeline.generate` yields TokenDelta messages and then one GenerateFinished whose counts cover
the whole request, whatever happened on the way. A migratable fault (engine unreachable,
stream cut or silent for `idle_timeout`, engine overloaded) re-routes the request, excluding
the instances that failed, and resends prompt + tokens generated so far with max_tokens
reduced: the engines are deterministic per context, so the caller sees one stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import msgspec

from switchyard.common import errors
from switchyard.common.errors import EngineError
from switchyard.preprocessor.dispatcher_client import (
    DispatcherClient,
    GenerationStream,
    NoDispatcher,
)
from switchyard.preprocessor.prefill_hop import HopStream, open_hop, supported
from switchyard.preprocessor.router_client import FALLBACK_POLICY, RouterClient
from switchyard.protos.messages import (
    STAGE_FINISHED,
    STAGE_FIRST_TOKEN,
    GenerateFailed,
    GenerateFinished,
    GenerateRequest,
    Instance,
    RouteRequest,
    RouteResponse,
    SamplingParams,
    TokenDelta,
)

log = logging.getLogger(__name__)


class NoWorker(errors.SwitchyardError):
    """No instance can take the request: `reason` is the router's error code."""

    def __init__(self, reason: str, message: str, model: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.model = model


@dataclass(frozen=True, slots=True)
class GenerationInput:
    request_id: str
    model: str
    prompt_ids: list[int]
    sampling: SamplingParams
    session_id: str | None = None  # x-session-id header or the OpenAI `user` field


class Pipeline:
    def __init__(
        self,
        router: RouterClient,
        dispatcher: DispatcherClient,
        *,
        route_timeout: float = 5.0,
        idle_timeout: float = 60.0,
        migration_limit: int = 3,
        busy_seconds: float = 1.0,
        on_migration: Callable[[str], None] | None = None,
        on_router_fallback: Callable[[], None] | None = None,
        instances: Callable[[], Mapping[int, Instance]] | None = None,
        hop_attempts: int = 2,
    ) -> None:
        self.router = router
        self.dispatcher = dispatcher
        self.route_timeout = route_timeout
        self.idle_timeout = idle_timeout
        self.migration_limit = migration_limit
        self.busy_seconds = busy_seconds
        self.on_migration = on_migration
        self.on_router_fallback = on_router_fallback
        # Fleet's instances (protocol, URL, bootstrap port of the prefill hop's engines).
        self.instances: Callable[[], Mapping[int, Instance]] = instances or dict
        self.hop_attempts = hop_attempts  # the prefill hop: first try + one retry

    def _hop_pair(self, reply: RouteResponse) -> tuple[Instance, Instance] | None:
        if reply.prefill_instance_id is None or reply.instance_id is None:
            return None
        known = self.instances()
        prefill = known.get(reply.prefill_instance_id)
        decode = known.get(reply.instance_id)
        if prefill is None or decode is None or not supported(prefill, decode):
            log.warning(
                "request_id=%s: no prefill hop from instance %d to %d (unknown or unsupported)",
                reply.request_id,
                reply.prefill_instance_id,
                reply.instance_id,
            )
            return None
        return prefill, decode

    async def _route(self, inp: GenerationInput, exclude: list[int]) -> RouteResponse:
        reply = await self.router.route(
            RouteRequest(
                request_id=inp.request_id,
                model=inp.model,
                token_ids=inp.prompt_ids,
                exclude=exclude,
                session_id=inp.session_id,
            ),
            self.route_timeout,
        )
        if reply.policy == FALLBACK_POLICY and self.on_router_fallback is not None:
            self.on_router_fallback()
        if reply.instance_id is None:
            raise NoWorker(reply.error, f"no engine available for model {inp.model!r}", inp.model)
        return reply

    async def _open(self, request: GenerateRequest) -> GenerationStream:
        try:
            return await self.dispatcher.open(request)
        except NoDispatcher:
            # A dispatcher restarting: give the replicas a moment to come back.
            if await self.dispatcher.wait_connected(self.route_timeout):
                return await self.dispatcher.open(request)
            raise NoWorker("no_dispatcher", "no dispatcher is reachable") from None

    async def generate(self, inp: GenerationInput) -> AsyncIterator[TokenDelta | GenerateFinished]:
        generated: list[int] = []
        exclude: list[int] = []
        sampling = inp.sampling
        failure: GenerateFailed | None = None
        hops = 0
        for attempt in range(self.migration_limit + 1):
            routed = await self._route(inp, exclude)
            instance_id = routed.instance_id
            assert instance_id is not None
            # The prefill hop only before any token (a later migration resends the prompt and
            # the tokens so far to one worker, as without disaggregation).
            pair = self._hop_pair(routed) if not generated else None
            if pair is not None and hops >= self.hop_attempts:
                assert failure is not None
                raise EngineError(
                    failure.kind,
                    f"the prefill hop failed {hops} times: {failure.message}",
                    failure.instance_id,
                )
            attempt_id = inp.request_id if attempt == 0 else f"{inp.request_id}.m{attempt}"
            request = GenerateRequest(
                request_id=attempt_id,
                instance_id=instance_id,
                token_ids=inp.prompt_ids + generated if generated else inp.prompt_ids,
                sampling=msgspec.structs.replace(
                    sampling,
                    max_tokens=sampling.max_tokens - len(generated),
                    min_tokens=max(0, sampling.min_tokens - len(generated)),
                ),
                data_parallel_rank=routed.dp_rank,
            )
            failure = None
            engine_done = False  # the dispatcher sent its last reply for this attempt
            first = True
            stream: GenerationStream | HopStream
            if pair is not None:
                hops += 1
                stream = await open_hop(self._open, request, *pair, self.idle_timeout)
            else:
                stream = await self._open(request)
            try:
                get = stream.queue.get
                queue = stream.queue
                pending = None  # a reply taken while coalescing, handled next
                while True:
                    try:
                        if pending is not None:
                            reply, pending = pending, None
                        elif queue.empty():
                            # asyncio.timeout, not wait_for: wait_for (3.11) can swallow a
                            # cancellation (the client went away) that races a reply.
                            async with asyncio.timeout(self.idle_timeout):
                                reply = await get()
                        else:  # replies already here: no timer to arm per token
                            reply = queue.get_nowait()
                    except TimeoutError:
                        failure = GenerateFailed(
                            request_id=attempt_id,
                            instance_id=instance_id,
                            kind=errors.DISCONNECTED,
                            message=f"no reply for {self.idle_timeout:g}s",
                        )
                        break
                    if type(reply) is TokenDelta:
                        if not queue.empty():
                            # The caller fell behind: merge the deltas already here, so it
                            # detokenizes and writes one SSE chunk instead of several.
                            ids = list(reply.token_ids)
                            while not queue.empty():
                                more = queue.get_nowait()
                                if type(more) is not TokenDelta:
                                    pending = more
                                    break
                                ids.extend(more.token_ids)
                            reply = TokenDelta(reply.request_id, ids)
                        generated.extend(reply.token_ids)
                        yield reply
                        if first:  # told after the client has its first token, not before
                            first = False
                            await self.router.progress(
                                inp.request_id, instance_id, STAGE_FIRST_TOKEN, final=False
                            )
                    elif type(reply) is GenerateFinished:
                        engine_done = True
                        yield msgspec.structs.replace(
                            reply,
                            request_id=inp.request_id,
                            prompt_tokens=len(inp.prompt_ids),
                            completion_tokens=len(generated),
                        )
                        return
                    else:
                        engine_done = True
                        failure = reply
                        break
            finally:
                if engine_done:
                    stream.close()
                else:  # the caller went away, stopped early, or the stream went silent
                    await stream.cancel()
                await self.router.progress(inp.request_id, instance_id, STAGE_FINISHED, final=True)
            if failure.kind not in errors.MIGRATABLE:
                raise EngineError(failure.kind, failure.message, failure.instance_id)
            if failure.kind == errors.OVERLOADED:
                await self.router.busy(failure.instance_id, self.busy_seconds)
            if failure.engine_fault:
                exclude.append(failure.instance_id)
            if attempt < self.migration_limit:
                log.warning(
                    "migrating request_id=%s from instance_id=%d kind=%s after %d tokens: %s",
                    inp.request_id,
                    failure.instance_id,
                    failure.kind,
                    len(generated),
                    failure.message,
                )
                if self.on_migration is not None:
                    self.on_migration(failure.kind)
        assert failure is not None  # the loop ran at least once and every pass failed
        raise EngineError(
            failure.kind,
            f"gave up after {self.migration_limit} migrations: {failure.message}",
            failure.instance_id,
        )
