"""vLLM (`vllm serve --grpc`): service vllm.grpc.engine.VllmEngine.

Stream facts this adapter relies on: chunk token_ids are deltas and chunk completion_tokens is
a per-chunk count; the final `complete` repeats the last delta (its counts are per-chunk too),
so this adapter counts completion tokens itself. GenerateResponse has no request_id, and
AbortRequest takes a list of ids.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from switchyard.common import errors
from switchyard.common.engines.base import EngineClient, EngineInfo, GenerateEvent
from switchyard.common.errors import EngineError
from switchyard.protos.messages import (
    PROTOCOL_VLLM,
    ROLE_DECODE,
    ROLE_PREFILL,
    GenerateFinished,
    GenerateRequest,
    TokenDelta,
)

# kv_both engines can serve either side: no fixed role, the operator's list decides.
_ROLES = {"kv_producer": ROLE_PREFILL, "kv_consumer": ROLE_DECODE}


class VllmClient(EngineClient):
    protocol = PROTOCOL_VLLM
    proto = pb
    service_name = "vllm.grpc.engine.VllmEngine"

    def __init__(self, channel: grpc.aio.Channel, instance_id: int | None = None) -> None:
        super().__init__(channel, instance_id)
        self.stub = pb_grpc.VllmEngineStub(channel)

    async def info(self, timeout: float) -> EngineInfo:
        model, server = await self._model_and_server_info(timeout)
        return EngineInfo(
            protocol=self.protocol,
            model=model.served_model_name or model.model_path,
            context_length=int(model.max_context_length),  # max_model_len
            block_size=int(server.block_size or 16),
            role=_ROLES.get(server.kv_role),
            local_prefill=server.kv_role != "kv_consumer",  # a consumer only takes remote KV
            max_running_requests=int(server.max_num_seqs or 0),
            tokenizer_path=model.tokenizer_path,
        )

    @staticmethod
    def build_request(request: GenerateRequest) -> pb.GenerateRequest:
        s = request.sampling
        params = pb.SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=max(s.top_k, 0),  # vLLM: 0 means no top-k
            min_p=s.min_p,
            frequency_penalty=s.frequency_penalty,
            presence_penalty=s.presence_penalty,
            repetition_penalty=s.repetition_penalty,
            max_tokens=s.max_tokens,
            min_tokens=s.min_tokens,
            stop_token_ids=s.stop_token_ids,
            ignore_eos=s.ignore_eos,
            skip_special_tokens=True,
            spaces_between_special_tokens=True,
            n=1,
        )
        if s.seed is not None:
            params.seed = s.seed
        built = pb.GenerateRequest(
            request_id=request.request_id,
            tokenized=pb.TokenizedInput(input_ids=request.token_ids),
            sampling_params=params,
            stream=request.stream,
        )
        if request.kv_transfer_params_json is not None:
            built.kv_transfer_params_json = request.kv_transfer_params_json
        return built

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateEvent]:
        request_id = request.request_id
        call = self.stub.Generate(self.build_request(request))
        generated = 0
        try:
            async for reply in call:
                if reply.HasField("chunk"):
                    ids = reply.chunk.token_ids
                    if ids:
                        generated += len(ids)
                        yield TokenDelta(request_id, list(ids))
                elif reply.HasField("complete"):
                    done = reply.complete
                    matched = done.matched_token_id if done.HasField("matched_token_id") else None
                    if not request.stream and done.output_ids:
                        # Non-streaming: the single complete carries every output id.
                        generated += len(done.output_ids)
                        yield TokenDelta(request_id, list(done.output_ids))
                    yield GenerateFinished(
                        request_id=request_id,
                        finish_reason=done.finish_reason or "stop",
                        prompt_tokens=done.prompt_tokens,
                        completion_tokens=generated,
                        cached_tokens=done.cached_tokens,
                        matched_token_id=matched,
                        kv_transfer_params_json=done.kv_transfer_params_json or None,
                    )
                    return
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from exc
        finally:
            call.cancel()
        raise EngineError(errors.DISCONNECTED, "stream ended without complete", self.instance_id)

    async def abort(self, request_id: str, timeout: float = 2.0) -> None:
        try:
            await self.stub.Abort(pb.AbortRequest(request_ids=[request_id]), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from exc
