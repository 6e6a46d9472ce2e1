"""vLLM (`vllm serve --grpc`): service vllm.grpc.engine.VllmEngine.

Stream facts this adapter relies on: chunk token_ids are deltas and chunk completion_tokens is
a per-chunk count; the final `complete` repeats the last delta (its counts are per-chunk too),
so this adapter counts completion tokens itself. GenerateResponse has no request_id, and
AbortRequest takes a list of ids.
"""

from __future__ import annotations

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from switchyard.common.engines.base import EngineClient, EngineInfo
from switchyard.protos.messages import (
    PROTOCOL_VLLM,
    ROLE_DECODE,
    ROLE_PREFILL,
    GenerateRequest,
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
            dp_size=max(1, int(server.data_parallel_size or 1)),
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
        if request.data_parallel_rank is not None:
            built.data_parallel_rank = request.data_parallel_rank
        return built

    def _kv_transfer_params(self, done: pb.GenerateComplete) -> str | None:
        return done.kv_transfer_params_json or None

    async def abort(self, request_id: str, timeout: float = 2.0) -> None:
        try:
            await self.stub.Abort(pb.AbortRequest(request_ids=[request_id]), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from exc
