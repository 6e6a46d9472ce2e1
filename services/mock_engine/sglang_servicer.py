"""`sglang.grpc.scheduler.SglangScheduler` over the neutral core, shaped as SGLang's servicer.

Generate: chunks carry delta token_ids and CUMULATIVE prompt/completion/cached counts; the last
chunk is followed by a `complete` built from the same step (its output_ids repeat that chunk's
delta, its counts are cumulative). Non-streaming: one `complete` with every output id. An EOS or
stop token that ends a request is in the ids and named in matched_token_id. ignore_eos also
disables stop_token_ids (SGLang checks both under it). An aborted request's stream ends with
status INTERNAL "Request aborted", as the servicer ends a request the scheduler aborted.
SamplingParams has no seed: temperature > 0 draws a per-request random salt. cached_tokens (chunks
and complete) is the prompt prefix served from the cache. SubscribeKvEvents streams the cache's
events (see kv_grpc); FlushCache clears the cache (AllBlocksCleared) unless requests are running.
server_args.kv_events_config is the KVEventsConfig JSON when --kv-events-endpoint is set.

The OpenAI surface: n > 1 runs n samples (SGLang's sub-requests `<id>-<i>`, each a random salt);
chunks and completes carry their `index`, streams interleave, and a non-streaming request
answers its n completes together, in index order. logit_bias (string keys) changes the draw.
return_logprob: each chunk has the output_logprobs of its tokens (top_logprobs_num alternatives,
most likely first), the streamed complete repeats the last chunk's, a non-streaming complete has
all; logprob_start_len >= 0 adds input_logprobs from that position (first token: no value) on a
sample's first chunk, or on its complete when not streaming. The constraint oneof (regex,
json_schema, ebnf_grammar, structural_tag) dictates the output (see structured), else a --script
rule may; one it cannot build is INVALID_ARGUMENT. --embedding: is_generation false, Embed
answers deterministic vectors, and Generate is INVALID_ARGUMENT "This model does not support
generation" (SGLang's gRPC servicer passes such a request to its scheduler unchecked; the mock
refuses it as vLLM does, so a client sees a clear error); a generation model's Embed is
INVALID_ARGUMENT too. The mock runs no reasoning parser: require_reasoning changes nothing
(reasoning_tokens stays 0) and constrained output starts constrained. n > 1 with
disaggregated_params (prefill or decode mode): INVALID_ARGUMENT.

Disaggregation (a request with DisaggregatedParams, on an engine in prefill or decode mode; the
"null" mode ignores them, as does either mode without them: served aggregated):
- prefill mode: runs the prefill and the first token (max_new_tokens 1), holds the prompt's
  KV under bootstrap_room for a decode engine to fetch from its bootstrap port, and only then
  answers (as SGLang's prefill finishes a request once its KV transfer is done): streaming, a
  chunk with the first token and a complete; else one complete; finish_reason "length",
  completion_tokens 1. No decode fetch within --bootstrap-timeout: INTERNAL, naming the room.
- decode mode: fetches the room's KV from bootstrap_host:bootstrap_port (waiting for the
  prefill, within --bootstrap-timeout), then decodes as usual with the prompt's whole blocks
  counted as cached and no prefill cost. A failed transfer ends the call with INTERNAL and
  SGLang's own "Decode transfer failed for request ... bootstrap_room=..." (its HTTP 500).
scheduler_info carries the handover counters (kv_handed_over, kv_received, ...); server_args
carries the bound disaggregation_bootstrap_port in prefill mode. Faults: --fail-* refuse a
Generate call before anything else (UNAVAILABLE / RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime

import grpc
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp
from smg_grpc_proto import sglang_scheduler_pb2 as pb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc

from switchyard.mock_engine import logprob_messages, structured
from switchyard.mock_engine.common_rpcs import CommonRpcs
from switchyard.mock_engine.config import DEFAULT_BOOTSTRAP_PORT, MAX_RUNNING_REQUESTS, Role
from switchyard.mock_engine.deps import (
    NOT_GENERATION,
    ConstraintSpec,
    ServicerDeps,
    log_request,
    refuse_if_faulted,
)
from switchyard.mock_engine.errors import KvTransferFailed, RequestRejected
from switchyard.mock_engine.kv_handover import room_key
from switchyard.mock_engine.samples import run_samples
from switchyard.mock_engine.types import (
    Finish,
    FinishReason,
    GenerationRequest,
    SamplingSpec,
    Scored,
    Step,
)

logger = logging.getLogger(__name__)

SERVICE_NAME = "sglang.grpc.scheduler.SglangScheduler"
VERSION = "mock"


_CONSTRAINTS = {
    "regex": structured.REGEX,
    "json_schema": structured.JSON_SCHEMA,
    "ebnf_grammar": structured.EBNF,
    "structural_tag": structured.STRUCTURAL_TAG,
}


def _logit_bias(params: pb.SamplingParams) -> dict[int, float]:
    bias: dict[int, float] = {}
    for key, value in params.logit_bias.items():
        try:
            bias[int(key)] = value
        except ValueError:
            raise ValueError(f"logit_bias key {key!r} is not a token id") from None
    return bias


def sampling_spec(request: pb.GenerateRequest) -> SamplingSpec:
    params = request.sampling_params
    return SamplingSpec(
        max_new_tokens=params.max_new_tokens if params.HasField("max_new_tokens") else None,
        min_new_tokens=params.min_new_tokens,
        # SGLang checks stop token ids only when ignore_eos is off.
        stop_token_ids=frozenset() if params.ignore_eos else frozenset(params.stop_token_ids),
        stop_strings=tuple(params.stop),
        ignore_eos=params.ignore_eos,
        temperature=params.temperature,
        seed=None,
        logit_bias=_logit_bias(params),
        logprobs=max(0, request.top_logprobs_num) if request.return_logprob else None,
    )


def spec_n(request: pb.GenerateRequest) -> int:
    return max(1, request.sampling_params.n)


def constraint_spec(params: pb.SamplingParams) -> ConstraintSpec | None:
    field = params.WhichOneof("constraint")
    if field is None:
        return None
    return _CONSTRAINTS[field], getattr(params, field), ()


def _output_logprobs(request: pb.GenerateRequest, scores: list[Scored]) -> pb.OutputLogProbs | None:
    if not request.return_logprob:
        return None
    return logprob_messages.output_logprobs(pb, scores, request.top_logprobs_num)


def _complete(
    request_id: str,
    output_ids: list[int] | tuple[int, ...],
    prompt_tokens: int,
    step: Step,
    index: int = 0,
    logprobs: pb.OutputLogProbs | None = None,
    prompt_logprobs: pb.InputLogProbs | None = None,
) -> pb.GenerateResponse:
    finish = step.finish or Finish(FinishReason.STOP)
    complete = pb.GenerateComplete(
        output_ids=output_ids,
        finish_reason=finish.reason.value,
        prompt_tokens=prompt_tokens,
        completion_tokens=step.completion_tokens,
        cached_tokens=step.cached_tokens,
        index=index,
        output_logprobs=logprobs,
        input_logprobs=prompt_logprobs,
    )
    if finish.matched_token_id is not None:
        complete.matched_token_id = finish.matched_token_id
    elif finish.matched_stop_str is not None:
        complete.matched_stop_str = finish.matched_stop_str
    return pb.GenerateResponse(request_id=request_id, complete=complete)


class SglangServicer(CommonRpcs, pb_grpc.SglangSchedulerServicer):
    def __init__(self, deps: ServicerDeps) -> None:
        self.deps = deps
        self.engine = deps.engine

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        request_id = request.request_id or self.engine.new_request_id()
        log_request(self.deps, "Generate", request_id, context)
        await refuse_if_faulted(self.deps, context)
        if self.deps.config.embedding:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NOT_GENERATION)
        try:
            if not request.HasField("tokenized"):
                raise ValueError("Tokenized input must be provided")
            spec = sampling_spec(request)
            prompt = tuple(request.tokenized.input_ids)
            plan = self.deps.output_plan(prompt, constraint_spec(request.sampling_params))
        except ValueError as exc:  # ConstraintError is one
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        rank = request.data_parallel_rank if request.HasField("data_parallel_rank") else None
        job = GenerationRequest(request_id, prompt, spec, output=plan, dp_rank=rank)
        config = self.deps.config
        disaggregated = request.HasField("disaggregated_params")
        if disaggregated and (config.kv_producer or config.kv_consumer) and spec_n(request) > 1:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "n > 1 with disaggregated_params is not supported by the mock engine",
            )
        try:
            if disaggregated and config.kv_producer:
                async for reply in self._prefill(request, job, context):
                    yield reply
                return
            if disaggregated and config.kv_consumer:
                job = await self._receive(request, job, context)
            async for reply in self._serve(request, job, context):
                yield reply
        except RequestRejected as exc:
            logger.info("rejected request_id=%s: %s", request_id, exc.reason)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.reason)

    def _prompt_logprobs(self, request: pb.GenerateRequest) -> pb.InputLogProbs | None:
        start = request.logprob_start_len
        if not request.return_logprob or start < 0:
            return None
        prompt = list(request.tokenized.input_ids)
        top = request.top_logprobs_num
        scores = self.engine.distribution.prompt_scores(prompt, start, top)
        return logprob_messages.input_logprobs(pb, prompt[start:], scores, top, scored_first=False)

    async def _serve(
        self, request: pb.GenerateRequest, job: GenerationRequest, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        request_id, prompt_tokens = job.request_id, len(job.prompt_ids)
        n = spec_n(request)
        jobs = [job]
        if n > 1:
            jobs = [
                dataclasses.replace(job, request_id=f"{job.request_id}-{i}", group=job.request_id)
                for i in range(n)
            ]
        prompt_logprobs = self._prompt_logprobs(request)
        first = [True] * n
        outputs: list[list[int]] = [[] for _ in range(n)]
        scores: list[list[Scored]] = [[] for _ in range(n)]
        finals: list[pb.GenerateResponse | None] = [None] * n
        async with aclosing(run_samples(self.engine, jobs)) as steps:
            async for index, step in steps:
                if step.finish is not None and step.finish.reason is FinishReason.ABORT:
                    await context.abort(grpc.StatusCode.INTERNAL, "Request aborted")
                step_scores = [step.score] if step.score is not None else []
                if request.stream:
                    inputs = prompt_logprobs if first[index] else None
                    first[index] = False
                    logprobs = _output_logprobs(request, step_scores)
                    yield pb.GenerateResponse(
                        request_id=request_id,
                        chunk=pb.GenerateStreamChunk(
                            token_ids=step.token_ids,
                            prompt_tokens=prompt_tokens,
                            completion_tokens=step.completion_tokens,
                            cached_tokens=step.cached_tokens,
                            index=index,
                            output_logprobs=logprobs,
                            input_logprobs=inputs,
                        ),
                    )
                    if step.finish is not None:
                        yield _complete(
                            request_id,
                            step.token_ids,
                            prompt_tokens,
                            step,
                            index,
                            logprobs,
                            inputs,
                        )
                    continue
                outputs[index].extend(step.token_ids)
                scores[index].extend(step_scores)
                if step.finish is not None:
                    finals[index] = _complete(
                        request_id,
                        outputs[index],
                        prompt_tokens,
                        step,
                        index,
                        _output_logprobs(request, scores[index]),
                        prompt_logprobs,
                    )
        for final in finals:  # not streaming: every sample's complete, in index order
            if final is not None:
                yield final

    async def _prefill(
        self, request: pb.GenerateRequest, job: GenerationRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        """Prefill mode: the first token, then the KV handover, then the answer."""
        room = request.disaggregated_params.bootstrap_room
        sampling = job.sampling
        first_only = dataclasses.replace(
            sampling, max_new_tokens=1, min_new_tokens=min(sampling.min_new_tokens, 1)
        )
        job = dataclasses.replace(job, sampling=first_only)
        timeout_s = self.deps.config.bootstrap_timeout_s
        replies: list[pb.GenerateResponse] = []
        async with aclosing(self._serve(request, job, context)) as answers:
            async for reply in answers:
                replies.append(reply)
                if not reply.HasField("complete"):
                    continue
                # The request still holds its blocks here; the offer holds them on.
                first = reply.complete.output_ids[-1] if reply.complete.output_ids else None
                _, picked = self.deps.disagg.offer(
                    room_key(room), job.prompt_ids, first_token=first, deadline_s=timeout_s
                )
                try:
                    taken = await asyncio.shield(picked)
                finally:
                    if not picked.done():  # cancelled: the router went away
                        self.deps.disagg.board.withdraw(room_key(room))
                if not taken:
                    await context.abort(
                        grpc.StatusCode.INTERNAL,
                        f"KV transfer failed for request {job.request_id} bootstrap_room={room}: "
                        f"no decode engine fetched it within {timeout_s:g}s",
                    )
        for reply in replies:
            yield reply

    async def _receive(
        self, request: pb.GenerateRequest, job: GenerationRequest, context: grpc.aio.ServicerContext
    ) -> GenerationRequest:
        """Decode mode: the room's KV from the prefill engine, or INTERNAL as SGLang fails."""
        self.engine.validate(job)  # a bad request fails before any transfer
        params = request.disaggregated_params
        room = params.bootstrap_room
        port = params.bootstrap_port or DEFAULT_BOOTSTRAP_PORT
        try:
            transferred = await self.deps.disagg.receive(
                params.bootstrap_host,
                port,
                room_key(room),
                job.prompt_ids,
                request_id=job.request_id,
                wait=True,
            )
        except KvTransferFailed as exc:
            message = (
                f"Decode transfer failed for request rank=0 decode_req.req.rid={job.request_id!r}"
                f" decode_req.req.bootstrap_room={room} with exception {exc}"
            )
            logger.warning("%s", message)
            await context.abort(grpc.StatusCode.INTERNAL, message)
        return dataclasses.replace(job, transferred_tokens=transferred)

    async def Embed(
        self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> pb.EmbedResponse:
        return await self._embed(
            request,
            context,
            pb.EmbedResponse,
            not_embedding="This model does not support embedding",
            not_tokenized="Tokenized input must be provided",
        )

    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=True, message="Health check passed")

    async def Abort(
        self, request: pb.AbortRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortResponse:
        found = self.engine.abort(request.request_id)
        verdict = "aborted" if found else "not found"
        return pb.AbortResponse(success=found, message=f"Request {request.request_id} {verdict}")

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        deps, facts = self.deps, self.deps.facts
        return pb.GetModelInfoResponse(
            model_path=deps.tokenizer_path,
            tokenizer_path=deps.tokenizer_path,
            is_generation=not deps.config.embedding,
            preferred_sampling_params="",
            default_sampling_params_json="{}",
            weight_version="default",
            served_model_name=deps.config.model_name,
            max_context_length=deps.config.kv_pool_tokens,  # SGLang reports its KV pool here
            vocab_size=facts.vocab_size,
            supports_vision=False,
            model_type=deps.model_type,
            architectures=deps.architectures,
            eos_token_ids=[facts.eos_token_id],
            pad_token_id=facts.pad_token_id,
            bos_token_id=facts.bos_token_id,
            max_req_input_len=self.engine.max_prompt_tokens,
        )

    def server_args(self) -> dict[str, object]:
        config = self.deps.config
        mode = "null" if config.role is Role.BOTH else config.role.value
        return {
            "model_path": self.deps.tokenizer_path,
            "tokenizer_path": self.deps.tokenizer_path,
            "served_model_name": config.model_name,
            "host": config.host,
            "port": self.deps.port,
            "context_length": config.context_length,
            "page_size": config.block_size,
            "max_running_requests": MAX_RUNNING_REQUESTS,
            "max_total_tokens": config.kv_pool_tokens,
            "skip_tokenizer_init": False,
            "disaggregation_mode": mode,
            "disaggregation_bootstrap_port": self.deps.disagg.port or config.bootstrap_port,
            "kv_events_config": self.deps.kv_events_config,
            "dp_size": config.dp_size,
            "tp_size": 1,
            "enable_dp_attention": False,
            "is_embedding": config.embedding,
            "mock_engine": True,
        }

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetServerInfoResponse:
        deps = self.deps
        server_args = Struct()
        server_args.update(self.server_args())
        scheduler_info = Struct()
        scheduler_info.update(
            {
                "is_generation": not deps.config.embedding,
                "max_total_num_tokens": deps.config.kv_pool_tokens,
                "max_req_input_len": self.engine.max_prompt_tokens,
                **deps.disagg.counters.as_dict(),
            }
        )
        start = Timestamp()
        start.FromSeconds(int(deps.start_time))
        return pb.GetServerInfoResponse(
            server_args=server_args,
            scheduler_info=scheduler_info,
            active_requests=self.engine.active_requests,
            is_paused=False,
            last_receive_timestamp=self.engine.loads().last_receive_time,
            uptime_seconds=deps.uptime_s(),
            sglang_version=VERSION,
            server_type="grpc",
            start_time=start,
            max_total_num_tokens=deps.config.kv_pool_tokens,
        )

    async def GetLoads(
        self, request: pb.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLoadsResponse:
        snaps = self.engine.rank_loads()
        if request.HasField("dp_rank") and not 0 <= request.dp_rank < len(snaps):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no dp rank {request.dp_rank}")
        loads = []
        for rank, snap in enumerate(snaps):
            if request.HasField("dp_rank") and rank != request.dp_rank:
                continue
            usage = snap.used_tokens / snap.capacity_tokens if snap.capacity_tokens else 0.0
            loads.append(
                pb.SchedulerLoad(
                    dp_rank=rank,
                    num_running_reqs=snap.running_requests,
                    num_waiting_reqs=0,
                    num_total_reqs=snap.running_requests,
                    num_used_tokens=snap.used_tokens,
                    max_total_num_tokens=snap.capacity_tokens,
                    token_usage=round(usage, 4),
                    gen_throughput=round(snap.gen_throughput, 2),
                    cache_hit_rate=round(snap.cache_hit_rate, 4),
                    utilization=round(usage, 4),
                    max_running_requests=MAX_RUNNING_REQUESTS,
                    num_waiting_uncached_tokens=0,
                )
            )
        n = len(loads)
        return pb.GetLoadsResponse(
            timestamp=datetime.fromtimestamp(self.deps.wall_clock(), UTC).isoformat(),
            version=VERSION,
            dp_rank_count=len(snaps),
            loads=loads,
            aggregate=pb.AggregateMetrics(
                total_running_reqs=sum(x.num_running_reqs for x in loads),
                total_waiting_reqs=0,
                total_reqs=sum(x.num_total_reqs for x in loads),
                avg_token_usage=sum(x.token_usage for x in loads) / n if n else 0.0,
                avg_throughput=sum(x.gen_throughput for x in loads) / n if n else 0.0,
                avg_utilization=sum(x.utilization for x in loads) / n if n else 0.0,
            ),
        )
