"""SglangScheduler over real gRPC stubs: stream shapes, sampling, errors, abort, info RPCs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from smg_grpc_proto import sglang_scheduler_pb2 as pb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as pb_grpc

from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import MockEngineServer, start_mock_engine

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = [100, 200, 300, 400, 500]
EOS = 1


def request(rid: str, prompt: list[int] = PROMPT, stream: bool = True, **params: Any) -> Any:
    params.setdefault("temperature", 0.0)
    params.setdefault("top_k", -1)
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(**params),
        stream=stream,
    )


async def collect(stub: Any, req: Any) -> list[Any]:
    return [reply async for reply in stub.Generate(req)]


def chunk_tokens(replies: list[Any]) -> list[int]:
    return [t for r in replies if r.HasField("chunk") for t in r.chunk.token_ids]


class TestStreaming:
    async def test_cumulative_counts_and_trailing_complete(self, sglang: Any) -> None:
        replies = await collect(sglang, request("s1", max_new_tokens=6, ignore_eos=True))
        chunks, last = replies[:-1], replies[-1]
        assert all(r.HasField("chunk") and r.request_id == "s1" for r in chunks)
        assert [len(r.chunk.token_ids) for r in chunks] == [1] * 6
        assert [r.chunk.completion_tokens for r in chunks] == [1, 2, 3, 4, 5, 6]
        assert {r.chunk.prompt_tokens for r in chunks} == {len(PROMPT)}
        assert last.HasField("complete") and last.request_id == "s1"
        done = last.complete
        assert done.finish_reason == "length"
        assert list(done.output_ids) == list(chunks[-1].chunk.token_ids)  # repeats the last delta
        assert (done.prompt_tokens, done.completion_tokens) == (len(PROMPT), 6)
        assert not done.HasField("matched_token_id")

    async def test_eos_ends_with_stop_and_matched_token(self, sglang: Any) -> None:
        replies = await collect(sglang, request("s2"))
        out = chunk_tokens(replies)
        assert out[-1] == EOS and EOS not in out[:-1]
        done = replies[-1].complete
        assert done.finish_reason == "stop" and done.matched_token_id == EOS
        assert done.completion_tokens == len(out)


class TestNonStreaming:
    async def test_single_complete_with_every_token(self, sglang: Any) -> None:
        streamed = chunk_tokens(await collect(sglang, request("n1", max_new_tokens=9)))
        replies = await collect(sglang, request("n2", stream=False, max_new_tokens=9))
        assert len(replies) == 1 and replies[0].HasField("complete")
        assert list(replies[0].complete.output_ids) == streamed
        assert replies[0].complete.completion_tokens == len(streamed)


class TestSampling:
    async def test_stop_token_id(self, sglang: Any) -> None:
        free = chunk_tokens(
            await collect(sglang, request("t1", max_new_tokens=20, ignore_eos=True))
        )
        index = next(i for i in range(2, 20) if free[i] not in free[:i])
        replies = await collect(
            sglang, request("t2", max_new_tokens=20, stop_token_ids=[free[index]])
        )
        assert chunk_tokens(replies) == free[: index + 1]
        assert replies[-1].complete.finish_reason == "stop"
        assert replies[-1].complete.matched_token_id == free[index]

    async def test_ignore_eos_also_ignores_stop_token_ids(self, sglang: Any) -> None:
        free = chunk_tokens(
            await collect(sglang, request("t3", max_new_tokens=20, ignore_eos=True))
        )
        replies = await collect(
            sglang, request("t4", max_new_tokens=20, ignore_eos=True, stop_token_ids=[free[3]])
        )
        assert chunk_tokens(replies) == free
        assert replies[-1].complete.finish_reason == "length"

    async def test_min_new_tokens(self, sglang: Any) -> None:
        free = chunk_tokens(await collect(sglang, request("m1")))
        minimum = len(free) + 2  # the free run stopped at an EOS before this
        out = chunk_tokens(await collect(sglang, request("m2", min_new_tokens=minimum)))
        assert len(out) > minimum and EOS not in out[:minimum]


class TestErrors:
    async def test_prompt_over_context(self, sglang: Any, sglang_engine: MockEngineServer) -> None:
        prompt = list(range(100, 100 + sglang_engine.config.context_length))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(sglang, request("long", prompt=prompt))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    async def test_empty_prompt(self, sglang: Any) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(sglang, request("empty", prompt=[]))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    async def test_max_new_tokens_beyond_context_is_capped(
        self, sglang: Any, sglang_engine: MockEngineServer
    ) -> None:
        room = sglang_engine.config.context_length - len(PROMPT)
        replies = await collect(
            sglang, request("cap", stream=False, max_new_tokens=10_000, ignore_eos=True)
        )
        assert replies[-1].complete.finish_reason == "length"
        assert replies[-1].complete.completion_tokens == room


class TestAbort:
    async def test_abort_ends_stream_with_internal(self) -> None:
        config = MockEngineConfig(protocol="sglang", port=0, ttft_ms=0, itl_ms=20)
        async with start_mock_engine(config) as engine:
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = pb_grpc.SglangSchedulerStub(channel)
                call = stub.Generate(request("victim", ignore_eos=True))
                first = await call.read()
                assert first.HasField("chunk")
                reply = await stub.Abort(pb.AbortRequest(request_id="victim"))
                assert reply.success
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    while await call.read() is not grpc.aio.EOF:
                        pass
                assert raised.value.code() == grpc.StatusCode.INTERNAL
                assert raised.value.details() == "Request aborted"
                missing = await stub.Abort(pb.AbortRequest(request_id="victim"))
                assert not missing.success
            assert engine.engine is not None and engine.engine.active_requests == 0

    async def test_client_cancel_stops_generation(self) -> None:
        config = MockEngineConfig(protocol="sglang", port=0, ttft_ms=0, itl_ms=20)
        async with start_mock_engine(config) as engine:
            assert engine.engine is not None
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = pb_grpc.SglangSchedulerStub(channel)
                call = stub.Generate(request("gone", ignore_eos=True))
                await call.read()
                assert engine.engine.active_requests == 1
                call.cancel()
                for _ in range(200):
                    if engine.engine.active_requests == 0:
                        break
                    await asyncio.sleep(0.01)
                assert engine.engine.active_requests == 0


class TestInfo:
    async def test_health_check(self, sglang: Any) -> None:
        assert (await sglang.HealthCheck(pb.HealthCheckRequest())).healthy

    async def test_model_info(self, sglang: Any, sglang_engine: MockEngineServer) -> None:
        info = await sglang.GetModelInfo(pb.GetModelInfoRequest())
        config = sglang_engine.config
        assert info.is_generation
        assert info.served_model_name == "deepseek-mock"
        assert info.tokenizer_path == info.model_path  # the served bundle, unpacked
        assert (Path(info.tokenizer_path) / "tokenizer_config.json").is_file()
        assert info.max_context_length == config.num_blocks * config.block_size
        assert info.max_req_input_len == config.context_length - 1
        assert info.vocab_size == 129280
        assert list(info.eos_token_ids) == [EOS] and info.bos_token_id == 0
        assert info.model_type == "deepseek_v3"
        assert list(info.architectures) == ["DeepseekV3ForCausalLM"]

    async def test_server_info(self, sglang: Any, sglang_engine: MockEngineServer) -> None:
        info = await sglang.GetServerInfo(pb.GetServerInfoRequest())
        args = json_format.MessageToDict(info.server_args)
        config = sglang_engine.config
        assert info.server_type == "grpc"
        assert args["context_length"] == config.context_length
        assert args["page_size"] == config.block_size
        assert args["disaggregation_mode"] == "null"
        assert args["disaggregation_bootstrap_port"] == 8998
        assert args["kv_events_config"] is None
        assert args["dp_size"] == 1
        assert args["served_model_name"] == "deepseek-mock"
        assert info.active_requests == 0 and info.uptime_seconds >= 0

    async def test_role_is_reported(self) -> None:
        config = MockEngineConfig(protocol="sglang", port=0, role="prefill")
        async with start_mock_engine(config) as engine:
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = pb_grpc.SglangSchedulerStub(channel)
                info = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert json_format.MessageToDict(info.server_args)["disaggregation_mode"] == "prefill"

    async def test_loads(self, sglang: Any, sglang_engine: MockEngineServer) -> None:
        loads = await sglang.GetLoads(pb.GetLoadsRequest())
        assert loads.dp_rank_count == 1 and len(loads.loads) == 1
        load = loads.loads[0]
        assert (load.num_running_reqs, load.num_waiting_reqs, load.num_total_reqs) == (0, 0, 0)
        assert load.max_total_num_tokens == sglang_engine.config.kv_pool_tokens

    async def test_kv_events_config_absent_without_endpoint(self, sglang: Any) -> None:
        info = await sglang.GetServerInfo(pb.GetServerInfoRequest())
        assert json_format.MessageToDict(info.server_args)["kv_events_config"] is None
