"""vLLM (`vllm serve --grpc`): service vllm.grpc.engine.VllmEngine.

Stream facts this adapter relies on: chunk token_ids are deltas and chunk completion_tokens is
a per-chunk count; the final `complete` repeats the last delta (its counts are per-chunk too),
so this adapter counts completion tokens itself. GenerateResponse has no request_id, and
AbortRequest takes a list of ids.

Request fields: seed is an optional int32 and logit_bias a map<int32, float> (values outside
int32 are refused: bad_request); the constraint oneof carries every neutral kind (ebnf as
`grammar`, json_object as the bool, choice as ChoiceConstraint). `logprobs` / `prompt_logprobs`
are the SamplingParams counts (vLLM's own top list starts with the chosen token).
grammar_from_first_token is set for a constrained request without `reasoning`: the engine then
constrains from the first token even when it runs a reasoning parser.
"""

from __future__ import annotations

from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from switchyard.common.engines import frames, wire
from switchyard.common.engines.base import EngineClient, EngineInfo
from switchyard.protos import messages as m
from switchyard.protos.messages import (
    PROTOCOL_VLLM,
    ROLE_DECODE,
    ROLE_PREFILL,
    Constraint,
    GenerateRequest,
)

# kv_both engines can serve either side: no fixed role, the operator's list decides.
_ROLES = {"kv_producer": ROLE_PREFILL, "kv_consumer": ROLE_DECODE}


def _constraint(params: pb.SamplingParams, constraint: Constraint) -> None:
    kind, value = constraint.kind, constraint.value
    if kind == m.CONSTRAINT_JSON_SCHEMA:
        params.json_schema = value
    elif kind == m.CONSTRAINT_JSON_OBJECT:
        params.json_object = True
    elif kind == m.CONSTRAINT_REGEX:
        params.regex = value
    elif kind == m.CONSTRAINT_EBNF:
        params.grammar = value
    elif kind == m.CONSTRAINT_STRUCTURAL_TAG:
        params.structural_tag = value
    elif kind == m.CONSTRAINT_CHOICE:
        if not constraint.choices:
            raise wire.refuse("constraint", "choice needs at least one choice")
        params.choice.choices.extend(constraint.choices)
    else:
        raise wire.refuse("constraint", f"unknown kind {kind!r}")


class VllmClient(EngineClient):
    protocol = PROTOCOL_VLLM
    proto = pb
    service_name = "vllm.grpc.engine.VllmEngine"
    stub_class = pb_grpc.VllmEngineStub
    relay_layout = frames.VLLM

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
            is_generation=bool(model.is_generation),
            dp_size=max(1, int(server.data_parallel_size or 1)),
        )

    @staticmethod
    def build_request(request: GenerateRequest) -> pb.GenerateRequest:
        s = request.sampling
        if s.n < 1:
            raise wire.refuse("n", f"must be at least 1, got {s.n}")
        # Submessages as dicts, set in place: a message given here is copied in (upb
        # serializes and parses it again), the prompt's ids with it, per request.
        built = pb.GenerateRequest(
            request_id=request.request_id,
            tokenized={"input_ids": request.token_ids},
            sampling_params={
                "temperature": s.temperature,
                "top_p": s.top_p,
                "top_k": wire.uint32("top_k", max(s.top_k, 0)),  # vLLM: 0 means no top-k
                "min_p": s.min_p,
                "frequency_penalty": s.frequency_penalty,
                "presence_penalty": s.presence_penalty,
                "repetition_penalty": s.repetition_penalty,
                "max_tokens": wire.uint32("max_tokens", s.max_tokens),
                "min_tokens": wire.uint32("min_tokens", s.min_tokens),
                "stop_token_ids": wire.uint32s("stop_token_ids", s.stop_token_ids),
                "ignore_eos": s.ignore_eos,
                "skip_special_tokens": True,
                "spaces_between_special_tokens": True,
                "n": wire.uint32("n", s.n),
            },
            stream=request.stream,
        )
        params = built.sampling_params
        if s.seed is not None:
            params.seed = wire.int32("seed", s.seed)
        if s.logit_bias:
            for token in s.logit_bias:
                wire.int32("logit_bias", token)
            params.logit_bias.update(s.logit_bias)
        if s.constraint is not None:
            _constraint(params, s.constraint)
            params.grammar_from_first_token = not request.reasoning
        if request.logprobs is not None:
            params.logprobs = wire.int32("logprobs", request.logprobs)
        if request.prompt_logprobs is not None:
            params.prompt_logprobs = wire.int32("prompt_logprobs", request.prompt_logprobs)
        if request.kv_transfer_params_json is not None:
            built.kv_transfer_params_json = request.kv_transfer_params_json
        if request.data_parallel_rank is not None:
            built.data_parallel_rank = request.data_parallel_rank
        return built

    @staticmethod
    def build_embed_request(request_id: str, token_ids: list[int]) -> pb.EmbedRequest:
        return pb.EmbedRequest(request_id=request_id, tokenized={"input_ids": token_ids})

    def _kv_transfer_params(self, done: pb.GenerateComplete) -> str | None:
        return done.kv_transfer_params_json or None

    async def abort(self, request_id: str, timeout: float = 2.0) -> None:
        await self._rpc(self.stub.Abort, pb.AbortRequest(request_ids=[request_id]), timeout)
