"""SGLang (`sglang --grpc-mode`): service sglang.grpc.scheduler.SglangScheduler.

Stream facts this adapter relies on: chunk token_ids are deltas, chunk counts are cumulative,
and a `complete` follows the last chunk repeating that chunk's tokens (so its output_ids are
ignored when streaming). Role and layout come from GetServerInfo.server_args.

Request fields: SamplingParams has no seed (refused: bad_request); logit_bias keys are token
ids as strings; the constraint oneof has regex / json_schema / ebnf_grammar / structural_tag, so
json_object goes as the JSON schema {"type": "object"} (as the smg gateway sends it) and choice
as a regex alternation of the escaped choices. Logprobs: one `top_logprobs_num` serves output
and prompt (the larger of the two asked; the adapter cuts each back); prompt logprobs are
`logprob_start_len` 0 (-1: none). `reasoning` is `require_reasoning`.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from switchyard.common.engines import frames, wire
from switchyard.common.engines.base import EngineClient, EngineInfo
from switchyard.common.kv_endpoints import publisher_binds
from switchyard.protos import messages as m
from switchyard.protos.messages import (
    PROTOCOL_SGLANG,
    ROLE_DECODE,
    ROLE_PREFILL,
    Constraint,
    GenerateRequest,
)

_ROLES = {"prefill": ROLE_PREFILL, "decode": ROLE_DECODE}


def _dp_size(args: dict[str, Any]) -> int:
    """How many schedulers (KV caches, KV-event publishers) the engine runs: dp_size times
    the attention-DP width newer SGLang resolves (`attn_dp_size`; the pinned release keeps
    --dp-size N --enable-dp-attention as dp_size N)."""

    def width(name: str) -> int:
        value = args.get(name)
        return int(value) if isinstance(value, int | float) and value >= 1 else 1

    return width("dp_size") * width("attn_dp_size")


def _kv_events_config(config: Any) -> dict[str, Any]:
    """server_args.kv_events_config: a JSON string (or a dict) with an `endpoint` (and, on
    newer SGLang, a `replay_endpoint`, `topic`, `bind`); {} when absent or unreadable."""
    if isinstance(config, str) and config.strip():
        import orjson

        try:
            config = orjson.loads(config)
        except orjson.JSONDecodeError:
            return {}
    return config if isinstance(config, dict) else {}


def _kv_events_endpoint(config: Any, key: str = "endpoint") -> str | None:
    endpoint = _kv_events_config(config).get(key)
    return str(endpoint) if endpoint else None


def _kv_events_facts(config: Any) -> dict[str, Any]:
    """EngineInfo's KV-event fields: the endpoints, the topic, and whether the publisher binds
    (SGLang's own rule, switchyard.common.kv_endpoints)."""
    parsed = _kv_events_config(config)
    endpoint = _kv_events_endpoint(parsed)
    bind = parsed.get("bind")
    topic = parsed.get("topic")
    return {
        "kv_events_endpoint": endpoint,
        "kv_replay_endpoint": _kv_events_endpoint(parsed, "replay_endpoint"),
        "kv_events_binds": publisher_binds(
            endpoint, PROTOCOL_SGLANG, bind if isinstance(bind, bool) else None
        )
        if endpoint
        else True,
        "kv_topic": str(topic) if isinstance(topic, str) else None,
    }


JSON_OBJECT_SCHEMA = '{"type": "object"}'
_REGEX_SPECIALS = frozenset("\\.^$|?*+()[]{}")


def escape_regex(text: str) -> str:
    """`text` as a regex literal: only the characters that are special get a backslash (what
    the engines' regex grammars and every regex dialect read alike)."""
    return "".join("\\" + c if c in _REGEX_SPECIALS else c for c in text)


def choice_regex(choices: list[str]) -> str:
    return "(" + "|".join(escape_regex(c) for c in choices) + ")"


def _constraint(params: pb.SamplingParams, constraint: Constraint) -> None:
    kind, value = constraint.kind, constraint.value
    if kind == m.CONSTRAINT_JSON_SCHEMA:
        params.json_schema = value
    elif kind == m.CONSTRAINT_JSON_OBJECT:
        params.json_schema = JSON_OBJECT_SCHEMA
    elif kind == m.CONSTRAINT_REGEX:
        params.regex = value
    elif kind == m.CONSTRAINT_EBNF:
        params.ebnf_grammar = value
    elif kind == m.CONSTRAINT_STRUCTURAL_TAG:
        params.structural_tag = value
    elif kind == m.CONSTRAINT_CHOICE:
        if not constraint.choices:
            raise wire.refuse("constraint", "choice needs at least one choice")
        params.regex = choice_regex(constraint.choices)
    else:
        raise wire.refuse("constraint", f"unknown kind {kind!r}")


class SglangClient(EngineClient):
    protocol = PROTOCOL_SGLANG
    proto = pb
    service_name = "sglang.grpc.scheduler.SglangScheduler"
    stub_class = pb_grpc.SglangSchedulerStub
    relay_layout = frames.SGLANG

    async def info(self, timeout: float) -> EngineInfo:
        model, server = await self._model_and_server_info(timeout)
        args = json_format.MessageToDict(server.server_args)
        # max_context_length here is the KV pool size; the context length is in server_args.
        context_length = int(args.get("context_length") or model.max_req_input_len or 0)
        mode = str(args.get("disaggregation_mode") or "null")
        role = _ROLES.get(mode)
        bootstrap = args.get("disaggregation_bootstrap_port")
        return EngineInfo(
            protocol=self.protocol,
            model=model.served_model_name or model.model_path,
            context_length=context_length,
            block_size=int(args.get("page_size") or 1),
            role=role,
            local_prefill=role != ROLE_DECODE,  # decode mode only takes transferred KV
            bootstrap_port=int(bootstrap) if role == ROLE_PREFILL and bootstrap else None,
            **_kv_events_facts(args.get("kv_events_config")),
            max_running_requests=int(args.get("max_running_requests") or 0),
            tokenizer_path=model.tokenizer_path,
            is_generation=bool(model.is_generation),
            dp_size=_dp_size(args),
        )

    @staticmethod
    def build_request(request: GenerateRequest) -> pb.GenerateRequest:
        s = request.sampling
        if s.seed is not None:
            raise wire.refuse("seed", "SGLang engines take no seed (their SamplingParams has none)")
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
                "top_k": wire.int32("top_k", s.top_k),  # SGLang: -1 means no top-k
                "min_p": s.min_p,
                "frequency_penalty": s.frequency_penalty,
                "presence_penalty": s.presence_penalty,
                "repetition_penalty": s.repetition_penalty,
                "max_new_tokens": wire.uint32("max_tokens", s.max_tokens),
                "min_new_tokens": wire.uint32("min_tokens", s.min_tokens),
                "stop_token_ids": wire.uint32s("stop_token_ids", s.stop_token_ids),
                "ignore_eos": s.ignore_eos,
                "skip_special_tokens": True,
                "spaces_between_special_tokens": True,
                "n": wire.uint32("n", s.n),
            },
            stream=request.stream,
            require_reasoning=request.reasoning,
        )
        params = built.sampling_params
        if s.logit_bias:
            wire.uint32s("logit_bias", s.logit_bias)
            params.logit_bias.update({str(token): bias for token, bias in s.logit_bias.items()})
        if s.constraint is not None:
            _constraint(params, s.constraint)
        if request.logprobs is not None or request.prompt_logprobs is not None:
            built.return_logprob = True
            top = max(request.logprobs or 0, request.prompt_logprobs or 0)
            built.top_logprobs_num = wire.int32("top_logprobs", top)
            built.logprob_start_len = 0 if request.prompt_logprobs is not None else -1
        else:
            built.logprob_start_len = -1
        if request.data_parallel_rank is not None:
            built.data_parallel_rank = request.data_parallel_rank
        if request.disagg is not None:
            d = request.disagg
            built.disaggregated_params.CopyFrom(
                pb.DisaggregatedParams(
                    bootstrap_host=d.bootstrap_host,
                    bootstrap_port=d.bootstrap_port,
                    bootstrap_room=d.bootstrap_room,
                )
            )
        return built

    @staticmethod
    def build_embed_request(request_id: str, token_ids: list[int]) -> pb.EmbedRequest:
        return pb.EmbedRequest(request_id=request_id, tokenized={"input_ids": token_ids})

    def _reasoning_tokens(self, done: pb.GenerateComplete) -> int:
        return int(done.reasoning_tokens)

    async def abort(self, request_id: str, timeout: float = 2.0) -> None:
        await self._rpc(
            self.stub.Abort,
            pb.AbortRequest(request_id=request_id, reason="client cancelled"),
            timeout,
        )
