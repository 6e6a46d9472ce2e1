"""`vllm.grpc.engine.VllmEngine` over the neutral core, shaped as vLLM's servicer.

Generate (streaming, vLLM's DELTA outputs): each chunk carries the step's new token_ids and
completion_tokens = that chunk's own count; the final step's chunk is followed by a `complete`
built from the same step (output_ids = that last delta, completion_tokens = its count).
Non-streaming: one `complete` with every output id. An EOS or stop token that ends a request
is in the ids; matched_token_id names a stop_token_ids match only (vLLM leaves it unset for
EOS). Abort: the stream ends with an empty chunk and a `complete` finish_reason "abort"
(non-streaming: one `complete` "abort" with the ids so far). Text input is tokenized with the
engine's tokenizer. temperature unset means 1.0 (vLLM's default); seed salts sampling.
cached_tokens (every chunk and the complete) is the prompt prefix served from the cache.
SubscribeKvEvents streams the cache's events (see kv_grpc); FlushCache clears the cache
(AllBlocksCleared) unless requests are running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime

import grpc
from smg_grpc_proto import vllm_engine_pb2 as pb
from smg_grpc_proto import vllm_engine_pb2_grpc as pb_grpc
from smg_grpc_proto.generated import common_pb2

from switchyard.mock_engine.config import MAX_RUNNING_REQUESTS, Role
from switchyard.mock_engine.deps import ServicerDeps, tokenizer_slices, unimplemented
from switchyard.mock_engine.errors import RequestRejected
from switchyard.mock_engine.kv_grpc import kv_event_stream
from switchyard.mock_engine.types import (
    GenerationRequest,
    SamplingSpec,
    Step,
)

logger = logging.getLogger(__name__)

SERVICE_NAME = "vllm.grpc.engine.VllmEngine"
VERSION = "mock"
KV_ROLES = {Role.BOTH: "", Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}
KV_CONNECTOR = "NixlConnector"  # reported once a role is set


def sampling_spec(params: pb.SamplingParams) -> SamplingSpec:
    if params.n > 1:
        raise ValueError(f"n={params.n} is not supported by the mock engine (n=1 only)")
    if params.HasField("max_tokens") and params.max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {params.max_tokens}.")
    return SamplingSpec(
        max_new_tokens=params.max_tokens if params.HasField("max_tokens") else None,
        min_new_tokens=params.min_tokens,
        stop_token_ids=frozenset(params.stop_token_ids),
        stop_strings=tuple(params.stop),
        ignore_eos=params.ignore_eos,
        temperature=params.temperature if params.HasField("temperature") else 1.0,
        seed=params.seed if params.HasField("seed") else None,
    )


def _complete(
    output_ids: list[int] | tuple[int, ...], prompt_tokens: int, step: Step
) -> pb.GenerateResponse:
    finish = step.finish
    complete = pb.GenerateComplete(
        output_ids=output_ids,
        finish_reason=finish.reason.value if finish is not None else "stop",
        prompt_tokens=prompt_tokens,
        completion_tokens=len(output_ids),
        cached_tokens=step.cached_tokens,
    )
    if finish is not None:
        if finish.matched_token_id is not None and not finish.matched_is_eos:
            complete.matched_token_id = finish.matched_token_id
        elif finish.matched_stop_str is not None:
            complete.matched_stop_str = finish.matched_stop_str
    return pb.GenerateResponse(complete=complete)


class VllmServicer(pb_grpc.VllmEngineServicer):
    def __init__(self, deps: ServicerDeps) -> None:
        self.deps = deps
        self.engine = deps.engine

    async def _prompt_ids(self, request: pb.GenerateRequest) -> tuple[int, ...]:
        if request.WhichOneof("input") == "tokenized":
            return tuple(request.tokenized.input_ids)
        if request.WhichOneof("input") == "text" and request.text:
            return tuple(await asyncio.to_thread(self.deps.facts.encode, request.text))
        return ()

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        request_id = request.request_id or self.engine.new_request_id()
        try:
            spec = sampling_spec(request.sampling_params)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        job = GenerationRequest(request_id, await self._prompt_ids(request), spec)
        prompt_tokens = len(job.prompt_ids)
        output: list[int] = []
        try:
            async with aclosing(self.engine.generate(job)) as steps:
                async for step in steps:
                    if request.stream:
                        yield pb.GenerateResponse(
                            chunk=pb.GenerateStreamChunk(
                                token_ids=step.token_ids,
                                prompt_tokens=prompt_tokens,
                                completion_tokens=len(step.token_ids),
                                cached_tokens=step.cached_tokens,
                            )
                        )
                        if step.finish is not None:
                            yield _complete(step.token_ids, prompt_tokens, step)
                    else:
                        output.extend(step.token_ids)
                        if step.finish is not None:
                            yield _complete(output, prompt_tokens, step)
        except RequestRejected as exc:
            logger.info("rejected request_id=%s: %s", request_id, exc.reason)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.reason)

    async def Embed(
        self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> pb.EmbedResponse:
        await unimplemented(context, "Embed")
        return pb.EmbedResponse()

    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=True, message="Health")

    async def Abort(
        self, request: pb.AbortRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortResponse:
        for request_id in request.request_ids:
            self.engine.abort(request_id)
        return pb.AbortResponse()

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        deps, facts = self.deps, self.deps.facts
        return pb.GetModelInfoResponse(
            model_path=str(facts.directory),
            is_generation=True,
            max_context_length=deps.config.context_length,
            vocab_size=facts.vocab_size,
            supports_vision=False,
            served_model_name=deps.config.model_name,
            tokenizer_path=str(facts.directory),
            model_type=deps.model_type,
            architectures=deps.architectures,
            eos_token_ids=[facts.eos_token_id],
            pad_token_id=facts.pad_token_id,
            bos_token_id=facts.bos_token_id,
            max_req_input_len=self.engine.max_prompt_tokens,
            default_sampling_params_json="{}",
        )

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetServerInfoResponse:
        deps = self.deps
        config = deps.config
        kv_role = KV_ROLES[config.role]
        return pb.GetServerInfoResponse(
            active_requests=self.engine.active_requests,
            is_paused=False,
            last_receive_timestamp=self.engine.loads().last_receive_time,
            uptime_seconds=deps.uptime_s(),
            server_type="vllm-grpc",
            kv_connector=KV_CONNECTOR if kv_role else "",
            kv_role=kv_role,
            kv_engine_id=f"mock-{config.host}-{deps.port}" if kv_role else "",
            data_parallel_size=1,
            kv_cache_dtype="auto",
            block_size=config.block_size,
            model_dtype="torch.bfloat16",
            max_num_seqs=MAX_RUNNING_REQUESTS,
        )

    async def GetLoads(
        self, request: pb.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLoadsResponse:
        snap = self.engine.loads()
        usage = snap.used_tokens / snap.capacity_tokens if snap.capacity_tokens else 0.0
        load = pb.SchedulerLoad(
            dp_rank=0,
            num_running_reqs=snap.running_requests,
            num_waiting_reqs=0,
            num_total_reqs=snap.running_requests,
            num_used_tokens=snap.used_tokens,
            max_total_num_tokens=snap.capacity_tokens,
            token_usage=usage,
            gen_throughput=snap.gen_throughput,
            cache_hit_rate=snap.cache_hit_rate,
            utilization=usage,
            max_running_requests=MAX_RUNNING_REQUESTS,
            num_waiting_uncached_tokens=0,
        )
        return pb.GetLoadsResponse(
            timestamp=datetime.fromtimestamp(self.deps.wall_clock(), UTC).isoformat(),
            version=VERSION,
            dp_rank_count=1,
            loads=[load],
        )

    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FlushCacheResponse:
        if self.engine.flush_cache():
            return common_pb2.FlushCacheResponse(success=True, message="Cache flushed successfully")
        return common_pb2.FlushCacheResponse(
            success=False, message="Cache not flushed: there are running requests"
        )

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        async for data, sha256 in tokenizer_slices(self.deps, context):
            yield common_pb2.GetTokenizerChunk(data=data, sha256=sha256)

    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        async for batch in kv_event_stream(self.deps.kv_events, request, context):
            yield batch
