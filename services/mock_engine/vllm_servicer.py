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

Disaggregation (kv_transfer_params_json; the typed kv_transfer_params alone carries no
handover). GetServerInfo reports kv_role kv_producer / kv_consumer for --role prefill / decode
and kv_both for --role both with a --kv-connector; without a connector (the default for both)
the params are ignored, as vLLM without a KV connector ignores them.
- producer, {"do_remote_decode": true}: runs the request as usual (the router sends
  max_tokens 1, stream off); when it ends by length, the prompt's KV stays pinned for
  --kv-transfer-ttl and the complete carries kv_transfer_params_json {"do_remote_prefill":
  true, "do_remote_decode": false, "remote_engine_id", "remote_request_id" (this request's
  id), "remote_block_ids", "remote_host", "remote_port" (the side channel), "tp_size": 1} and
  the typed kv_transfer_params {remote_host, remote_port}. Ended otherwise (EOS, stop): none,
  as NIXL hands over only length-capped prefills.
- consumer, {"do_remote_prefill": true, remote_host, remote_port, remote_request_id,
  remote_block_ids, ...}: fetches that KV from the prefill's side channel, then decodes as
  usual with the prompt's whole blocks counted as cached and no prefill cost. KV unknown,
  expired, already taken, for another prompt, or the side channel unreachable:
  FAILED_PRECONDITION naming the remote_request_id. remote_host/remote_port missing:
  INVALID_ARGUMENT.
Faults: --fail-* refuse a Generate call before anything else (UNAVAILABLE /
RESOURCE_EXHAUSTED).

The OpenAI surface: n > 1 runs n samples (sample i seeded with seed + i, as vLLM's parallel
sampling does); chunks and completes carry their `index`, streams interleave, each sample ends
with its own complete (not streaming: all n completes once every sample is done, by index).
logit_bias (int keys) changes the draw; an out-of-vocabulary key is INVALID_ARGUMENT.
logprobs k: each chunk's output_logprobs (the chosen token first, then the most likely others,
k in all); a streamed complete repeats the last delta's, a non-streaming one
has all. prompt_logprobs k: input_logprobs (first token: no value; each top list starts with
the prompt token) on a sample's first chunk, and on every non-streaming complete. More than
--max-logprobs (20) of either: INVALID_ARGUMENT in vLLM's words. The constraint oneof
(json_schema, regex, grammar, structural_tag, json_object, choice) dictates the output (see
structured), else a --script rule may; one it cannot build is INVALID_ARGUMENT. The mock runs no
reasoning parser: grammar_from_first_token changes nothing (its output starts constrained).
--embedding: is_generation false, Embed answers deterministic vectors, Generate
INVALID_ARGUMENT "This model does not support generation" (a generation model's Embed: "This
model does not support pooling").
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any

import grpc
from smg_grpc_proto import vllm_engine_pb2 as pb
from smg_grpc_proto import vllm_engine_pb2_grpc as pb_grpc

from switchyard.mock_engine import logprob_messages, structured
from switchyard.mock_engine.common_rpcs import CommonRpcs
from switchyard.mock_engine.config import MAX_RUNNING_REQUESTS
from switchyard.mock_engine.deps import (
    NOT_GENERATION,
    ConstraintSpec,
    ServicerDeps,
    log_request,
    refuse_if_faulted,
)
from switchyard.mock_engine.errors import KvTransferFailed, PromptTooLong, RequestRejected
from switchyard.mock_engine.kv_handover import request_key
from switchyard.mock_engine.samples import run_samples
from switchyard.mock_engine.types import (
    FinishReason,
    GenerationRequest,
    SamplingSpec,
    Scored,
    Step,
)

logger = logging.getLogger(__name__)

SERVICE_NAME = "vllm.grpc.engine.VllmEngine"
VERSION = "mock"
TP_SIZE = 1


def _logprob_count(
    params: pb.SamplingParams, field: str, what: str, limit: int, vocab: int
) -> int | None:
    if not params.HasField(field):
        return None
    count = getattr(params, field)
    wanted = vocab if count == -1 else count
    if wanted > limit or count < -1:
        raise ValueError(
            f"Requested {what} logprobs of {wanted}, which is greater than max allowed: {limit} "
            f"(parameter={field}, value={wanted})"
        )
    return wanted


def vllm_words(exc: RequestRejected) -> str:
    """A refusal as vLLM 0.32 words it (recorded in tests/fixtures/vllm_real.json)."""
    if isinstance(exc, PromptTooLong):
        if exc.length > exc.context:
            return (
                f"The decoder prompt (length {exc.length}) is longer than the maximum model "
                f"length of {exc.context}. Make sure that `max_model_len` is no smaller than "
                "the number of text tokens."
            )
        return (
            f"The decoder prompt (length {exc.length}) plus the number of requested output "
            f"tokens (at least 1) is longer than the maximum model length of {exc.context}. "
            "Make sure that `max_model_len` is no smaller than the number of text tokens "
            "(prompt + requested output tokens)."
        )
    if exc.parameter is not None:
        return f"{exc.reason} (parameter={exc.parameter}, value={exc.value})"
    return exc.reason


def sampling_spec(params: pb.SamplingParams, max_logprobs: int, vocab: int) -> SamplingSpec:
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
        logit_bias=dict(params.logit_bias),
        logprobs=_logprob_count(params, "logprobs", "sample", max_logprobs, vocab),
    )


def constraint_spec(params: pb.SamplingParams) -> ConstraintSpec | None:
    field = params.WhichOneof("constraint")
    if field == "json_schema":
        return structured.JSON_SCHEMA, params.json_schema, ()
    if field == "regex":
        return structured.REGEX, params.regex, ()
    if field == "grammar":
        return structured.EBNF, params.grammar, ()
    if field == "structural_tag":
        return structured.STRUCTURAL_TAG, params.structural_tag, ()
    if field == "json_object" and params.json_object:
        return structured.JSON_OBJECT, "", ()
    if field == "choice":
        return structured.CHOICE, "", tuple(params.choice.choices)
    return None


def transfer_params(request: pb.GenerateRequest) -> dict[str, Any] | None:
    """kv_transfer_params_json as a dict (ValueError if it is not a JSON object)."""
    if not request.HasField("kv_transfer_params_json"):
        return None
    try:
        params = json.loads(request.kv_transfer_params_json)
    except json.JSONDecodeError as exc:
        raise ValueError(f"Invalid kv_transfer_params_json: {exc}") from None
    if not isinstance(params, dict):
        raise ValueError("kv_transfer_params_json must be a JSON object")
    return params


def _complete(
    output_ids: list[int] | tuple[int, ...],
    prompt_tokens: int,
    step: Step,
    handover: dict[str, Any] | None = None,
    index: int = 0,
    logprobs: pb.OutputLogProbs | None = None,
    prompt_logprobs: pb.InputLogProbs | None = None,
) -> pb.GenerateResponse:
    finish = step.finish
    complete = pb.GenerateComplete(
        output_ids=output_ids,
        finish_reason=finish.reason.value if finish is not None else "stop",
        prompt_tokens=prompt_tokens,
        completion_tokens=len(output_ids),
        cached_tokens=step.cached_tokens,
        index=index,
        output_logprobs=logprobs,
        input_logprobs=prompt_logprobs,
    )
    if finish is not None:
        if finish.matched_token_id is not None and not finish.matched_is_eos:
            complete.matched_token_id = finish.matched_token_id
        elif finish.matched_stop_str is not None:
            complete.matched_stop_str = finish.matched_stop_str
    if handover is not None:
        complete.kv_transfer_params_json = json.dumps(handover)
        complete.kv_transfer_params.remote_host = handover["remote_host"]
        complete.kv_transfer_params.remote_port = handover["remote_port"]
    return pb.GenerateResponse(complete=complete)


def _output_logprobs(top: int | None, scores: list[Scored]) -> pb.OutputLogProbs | None:
    if top is None:
        return None
    return logprob_messages.output_logprobs(pb, scores, top)


class VllmServicer(CommonRpcs, pb_grpc.VllmEngineServicer):
    def __init__(self, deps: ServicerDeps) -> None:
        self.deps = deps
        self.engine = deps.engine

    async def _prompt_ids(self, request: pb.GenerateRequest) -> tuple[int, ...]:
        if request.WhichOneof("input") == "tokenized":
            return tuple(request.tokenized.input_ids)
        if request.WhichOneof("input") == "text" and request.text:
            return tuple(await asyncio.to_thread(self.deps.facts.encode, request.text))
        return ()

    def _prompt_logprobs(
        self, params: pb.SamplingParams, prompt: tuple[int, ...]
    ) -> pb.InputLogProbs | None:
        config = self.deps.config
        top = _logprob_count(
            params, "prompt_logprobs", "prompt", config.max_logprobs, self.deps.facts.vocab_size
        )
        if top is None:
            return None
        scores = self.engine.distribution.prompt_scores(prompt, 0, top)
        return logprob_messages.input_logprobs(pb, prompt, scores, top, scored_first=True)

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        request_id = request.request_id or self.engine.new_request_id()
        log_request(self.deps, "Generate", request_id, context)
        await refuse_if_faulted(self.deps, context)
        config = self.deps.config
        if config.embedding:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NOT_GENERATION)
        try:
            params = request.sampling_params
            spec = sampling_spec(params, config.max_logprobs, self.deps.facts.vocab_size)
            transfer = transfer_params(request)
            prompt = await self._prompt_ids(request)
            plan = self.deps.output_plan(prompt, constraint_spec(params))
            prompt_logprobs = self._prompt_logprobs(params, prompt)
        except ValueError as exc:  # ConstraintError is one
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        rank = request.data_parallel_rank if request.HasField("data_parallel_rank") else None
        job = GenerationRequest(request_id, prompt, spec, output=plan, dp_rank=rank)
        n = max(1, params.n)
        produce = consume = False
        if transfer is not None:
            produce = bool(transfer.get("do_remote_decode")) and config.kv_producer
            consume = bool(transfer.get("do_remote_prefill")) and config.kv_consumer
            if (transfer.get("do_remote_decode") or transfer.get("do_remote_prefill")) and not (
                produce or consume
            ):
                logger.warning(
                    "request_id=%s: kv_transfer_params ignored (kv_role %r)",
                    request_id,
                    config.vllm_kv_role,
                )
        if n > 1 and (produce or consume):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "n > 1 with kv_transfer_params is not supported by the mock engine",
            )
        prompt_tokens = len(job.prompt_ids)
        top = spec.logprobs
        try:
            if consume and transfer is not None:
                job = await self._receive(job, transfer, context)
            jobs = [job]
            if n > 1:
                jobs = [self._sample(job, i) for i in range(n)]
            first = [True] * n
            outputs: list[list[int]] = [[] for _ in range(n)]
            scores: list[list[Scored]] = [[] for _ in range(n)]
            finals: list[pb.GenerateResponse | None] = [None] * n
            async with aclosing(run_samples(self.engine, jobs)) as steps:
                async for index, step in steps:
                    handover = None
                    if produce and step.finish is not None:
                        handover = self._offer(job, step)
                    step_scores = [step.score] if step.score is not None else []
                    if request.stream:
                        inputs = prompt_logprobs if first[index] else None
                        logprobs = _output_logprobs(top, step_scores)
                        yield pb.GenerateResponse(
                            chunk=pb.GenerateStreamChunk(
                                token_ids=step.token_ids,
                                prompt_tokens=prompt_tokens,
                                completion_tokens=len(step.token_ids),
                                cached_tokens=step.cached_tokens,
                                index=index,
                                output_logprobs=logprobs,
                                input_logprobs=inputs,
                            )
                        )
                        if step.finish is not None:
                            # The final output holds prompt logprobs only if it is the first.
                            yield _complete(
                                step.token_ids,
                                prompt_tokens,
                                step,
                                handover,
                                index,
                                logprobs,
                                inputs,
                            )
                        first[index] = False
                    else:
                        outputs[index].extend(step.token_ids)
                        scores[index].extend(step_scores)
                        if step.finish is not None:
                            finals[index] = _complete(
                                outputs[index],
                                prompt_tokens,
                                step,
                                handover,
                                index,
                                _output_logprobs(top, scores[index]),
                                prompt_logprobs,
                            )
            # Not streaming: vLLM answers once the whole request is done, in index order.
            for final in finals:
                if final is not None:
                    yield final
        except RequestRejected as exc:
            reason = vllm_words(exc)
            logger.info("rejected request_id=%s: %s", request_id, reason)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)

    @staticmethod
    def _sample(job: GenerationRequest, index: int) -> GenerationRequest:
        """Sample `index` of an n > 1 request: seed + index (vLLM's parallel sampling)."""
        seed = job.sampling.seed
        sampling = job.sampling
        if seed is not None:
            sampling = dataclasses.replace(sampling, seed=seed + index)
        return dataclasses.replace(
            job, request_id=f"{index}_{job.request_id}", sampling=sampling, group=job.request_id
        )

    def _offer(self, job: GenerationRequest, step: Step) -> dict[str, Any] | None:
        """Producer: pin a length-capped prefill's prompt KV for pickup; its transfer params."""
        if step.finish is None or step.finish.reason is not FinishReason.LENGTH:
            return None
        config, disagg = self.deps.config, self.deps.disagg
        payload, _ = disagg.offer(
            request_key(job.request_id),
            job.prompt_ids,
            first_token=step.token_ids[-1] if step.token_ids else None,
            deadline_s=config.kv_transfer_ttl_s,
            with_block_ids=True,
        )
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": disagg.engine_id,
            "remote_request_id": job.request_id,
            "remote_block_ids": list(payload.block_ids),
            "remote_host": config.host,
            "remote_port": disagg.port,
            "tp_size": TP_SIZE,
        }

    async def _receive(
        self, job: GenerationRequest, params: dict[str, Any], context: grpc.aio.ServicerContext
    ) -> GenerationRequest:
        """Consumer: the prompt's KV from the prefill's side channel, or FAILED_PRECONDITION."""
        self.engine.validate(job)  # a bad request fails before any transfer
        host, port = params.get("remote_host"), params.get("remote_port")
        remote_id = params.get("remote_request_id") or job.request_id
        block_ids = params.get("remote_block_ids")
        if not isinstance(host, str) or not host or not isinstance(port, int):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "kv_transfer_params: do_remote_prefill needs remote_host and remote_port",
            )
        if block_ids is not None and not (
            isinstance(block_ids, list) and all(isinstance(b, int) for b in block_ids)
        ):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "kv_transfer_params: remote_block_ids must be a list of ints",
            )
        try:
            transferred = await self.deps.disagg.receive(
                host,
                port,
                request_key(str(remote_id)),
                job.prompt_ids,
                request_id=job.request_id,
                wait=False,
                block_ids=block_ids,
            )
        except KvTransferFailed as exc:
            message = f"KV transfer failed for remote_request_id={remote_id}: {exc}"
            logger.warning("request_id=%s: %s", job.request_id, message)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
        return dataclasses.replace(job, transferred_tokens=transferred)

    async def Embed(
        self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> pb.EmbedResponse:
        return await self._embed(
            request,
            context,
            pb.EmbedResponse,
            not_embedding="This model does not support pooling",
            not_tokenized="EmbedRequest requires tokenized input",
        )

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
            model_path=deps.tokenizer_path,
            is_generation=not deps.config.embedding,
            max_context_length=deps.config.context_length,
            vocab_size=facts.vocab_size,
            supports_vision=False,
            served_model_name=deps.config.model_name,
            tokenizer_path=deps.tokenizer_path,
            model_type=deps.model_type,
            architectures=deps.architectures,
            eos_token_ids=[facts.eos_token_id],
            pad_token_id=facts.pad_token_id,
            bos_token_id=facts.bos_token_id,
            # vLLM reports max_model_len here and no defaults as "" (recorded, 0.32).
            max_req_input_len=deps.config.context_length,
            default_sampling_params_json="",
        )

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetServerInfoResponse:
        deps = self.deps
        config = deps.config
        kv_role = config.vllm_kv_role
        return pb.GetServerInfoResponse(
            active_requests=self.engine.active_requests,
            is_paused=False,
            last_receive_timestamp=self.engine.loads().last_receive_time,
            uptime_seconds=deps.uptime_s(),
            server_type="",  # vLLM 0.32's servicer leaves it empty
            kv_connector=config.kv_connector or "",
            kv_role=kv_role,
            kv_engine_id=deps.disagg.engine_id if kv_role else "",
            data_parallel_size=config.dp_size,
            kv_cache_dtype="auto",
            block_size=config.block_size,
            model_dtype="torch.bfloat16",
            multimodal_encoder_dtype="bfloat16",
            # The mock's constrained outputs start at the first token (no reasoning parser).
            constrained_decoding_start="first_token",
            max_num_seqs=MAX_RUNNING_REQUESTS,
        )

    async def GetLoads(
        self, request: pb.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLoadsResponse:
        loads = []
        for rank, snap in enumerate(self.engine.rank_loads()):
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
                    token_usage=usage,
                    gen_throughput=snap.gen_throughput,
                    cache_hit_rate=snap.cache_hit_rate,
                    utilization=usage,
                    max_running_requests=MAX_RUNNING_REQUESTS,
                    num_waiting_uncached_tokens=0,
                )
            )
        return pb.GetLoadsResponse(
            timestamp=datetime.fromtimestamp(self.deps.wall_clock(), UTC).isoformat(),
            version=VERSION,
            dp_rank_count=len(loads),
            loads=loads,
        )
