"""Calls straight to a real vLLM engine's gRPC service (no Switchyard in between), for the
tests that need the engine's own word: its loads, its cached tokens, its KV events."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import grpc
from engines import Engine
from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc


def stub(engine: Engine) -> tuple[grpc.Channel, vllm_engine_pb2_grpc.VllmEngineStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{engine.port}")
    return channel, vllm_engine_pb2_grpc.VllmEngineStub(channel)


@dataclass
class Generated:
    token_ids: list[int]
    cached_tokens: int
    prompt_tokens: int
    finish_reason: str


def generate(engine: Engine, prompt: list[int], max_tokens: int = 1) -> Generated:
    """A greedy, unstreamed request with a token-id prompt."""
    request = vllm_engine_pb2.GenerateRequest(
        request_id=f"direct-{uuid.uuid4().hex[:8]}",
        tokenized=vllm_engine_pb2.TokenizedInput(input_ids=prompt),
        sampling_params=vllm_engine_pb2.SamplingParams(
            temperature=0.0, top_p=1.0, repetition_penalty=1.0, max_tokens=max_tokens
        ),
        stream=False,
    )
    channel, engine_stub = stub(engine)
    with channel:
        replies = list(engine_stub.Generate(request, timeout=120))
    done = replies[-1].complete
    return Generated(
        list(done.output_ids), done.cached_tokens, done.prompt_tokens, done.finish_reason
    )


def running(engine: Engine) -> int:
    """Requests the engine is running or has waiting (GetLoads)."""
    channel, engine_stub = stub(engine)
    with channel:
        reply = engine_stub.GetLoads(vllm_engine_pb2.GetLoadsRequest(), timeout=10)
    return sum(load.num_running_reqs + load.num_waiting_reqs for load in reply.loads)
