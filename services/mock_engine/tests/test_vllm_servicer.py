"""VllmEngine over real gRPC stubs: stream shapes, sampling, errors, abort, info RPCs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from smg_grpc_proto import vllm_engine_pb2 as pb
from smg_grpc_proto import vllm_engine_pb2_grpc as pb_grpc

from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import MockEngineServer, start_mock_engine

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = [100, 200, 300, 400, 500]
EOS = 1


def request(rid: str, prompt: list[int] = PROMPT, stream: bool = True, **params: Any) -> Any:
    params.setdefault("temperature", 0.0)
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
    async def test_per_chunk_counts_and_trailing_complete(self, vllm: Any) -> None:
        replies = await collect(vllm, request("v1", max_tokens=6, ignore_eos=True))
        chunks, last = replies[:-1], replies[-1]
        assert all(r.HasField("chunk") for r in chunks) and len(chunks) == 6
        assert [r.chunk.completion_tokens for r in chunks] == [1] * 6  # each chunk's own count
        assert {r.chunk.prompt_tokens for r in chunks} == {len(PROMPT)}
        done = last.complete
        assert done.finish_reason == "length"
        assert list(done.output_ids) == list(chunks[-1].chunk.token_ids)  # the last delta
        assert done.completion_tokens == len(done.output_ids)
        assert done.prompt_tokens == len(PROMPT)

    async def test_eos_is_in_the_ids_but_not_matched(self, vllm: Any) -> None:
        replies = await collect(vllm, request("v2"))
        out = chunk_tokens(replies)
        assert out[-1] == EOS and EOS not in out[:-1]
        done = replies[-1].complete
        assert done.finish_reason == "stop" and not done.HasField("matched_token_id")


class TestNonStreaming:
    async def test_single_complete_with_every_token(self, vllm: Any) -> None:
        streamed = chunk_tokens(await collect(vllm, request("n1", max_tokens=9)))
        replies = await collect(vllm, request("n2", stream=False, max_tokens=9))
        assert len(replies) == 1
        assert list(replies[0].complete.output_ids) == streamed
        assert replies[0].complete.completion_tokens == len(streamed)


class TestSampling:
    async def test_stop_token_id_is_matched(self, vllm: Any) -> None:
        free = chunk_tokens(await collect(vllm, request("t1", max_tokens=20, ignore_eos=True)))
        index = next(i for i in range(2, 20) if free[i] not in free[:i])
        replies = await collect(vllm, request("t2", max_tokens=20, stop_token_ids=[free[index]]))
        assert chunk_tokens(replies) == free[: index + 1]
        assert replies[-1].complete.finish_reason == "stop"
        assert replies[-1].complete.matched_token_id == free[index]

    async def test_ignore_eos_runs_to_max_tokens(self, vllm: Any) -> None:
        out = chunk_tokens(await collect(vllm, request("i1", max_tokens=150, ignore_eos=True)))
        assert len(out) == 150 and EOS not in out

    async def test_min_tokens(self, vllm: Any) -> None:
        free = chunk_tokens(await collect(vllm, request("m1")))
        minimum = len(free) + 2
        out = chunk_tokens(await collect(vllm, request("m2", min_tokens=minimum)))
        assert len(out) > minimum and EOS not in out[:minimum]

    async def test_seed_makes_sampling_repeatable(self, vllm: Any) -> None:
        def sampled(rid: str) -> Any:
            return request(rid, max_tokens=12, ignore_eos=True, temperature=0.8, seed=5)

        first = chunk_tokens(await collect(vllm, sampled("seed1")))
        assert first == chunk_tokens(await collect(vllm, sampled("seed2")))
        greedy = chunk_tokens(await collect(vllm, request("g", max_tokens=12, ignore_eos=True)))
        assert first != greedy

    async def test_text_input_is_tokenized(self, vllm: Any) -> None:
        req = pb.GenerateRequest(
            request_id="text",
            text="Hello there",
            sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=3),
            stream=False,
        )
        replies = await collect(vllm, req)
        assert replies[-1].complete.prompt_tokens > 0

    @pytest.mark.parametrize(
        "params",
        [{"max_tokens": 0}, {"temperature": -0.5}, {"logprobs": 21}, {"logit_bias": {10**7: 1.0}}],
    )
    async def test_bad_sampling_is_invalid_argument(
        self, vllm: Any, params: dict[str, Any]
    ) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(vllm, request("bad", **params))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


class TestErrors:
    async def test_prompt_over_context(self, vllm: Any, vllm_engine: MockEngineServer) -> None:
        prompt = list(range(100, 100 + vllm_engine.config.context_length))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(vllm, request("long", prompt=prompt))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


class TestAbort:
    @staticmethod
    def slow() -> MockEngineConfig:
        return MockEngineConfig(protocol="vllm", port=0, ttft_ms=0, itl_ms=20)

    async def test_abort_ends_stream_with_abort_complete(self) -> None:
        async with start_mock_engine(self.slow()) as engine:
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = pb_grpc.VllmEngineStub(channel)
                call = stub.Generate(request("a1", ignore_eos=True))
                assert (await call.read()).HasField("chunk")
                await stub.Abort(pb.AbortRequest(request_ids=["a1", "unknown"]))
                rest = []
                while (reply := await call.read()) is not grpc.aio.EOF:
                    rest.append(reply)
                assert rest[-1].HasField("complete")
                assert rest[-1].complete.finish_reason == "abort"
                assert list(rest[-1].complete.output_ids) == []
                assert rest[-2].HasField("chunk") and list(rest[-2].chunk.token_ids) == []
                assert await call.code() == grpc.StatusCode.OK

    async def test_abort_non_streaming_returns_tokens_so_far(self) -> None:
        async with start_mock_engine(self.slow()) as engine:
            assert engine.engine is not None
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = pb_grpc.VllmEngineStub(channel)
                call = stub.Generate(request("a2", stream=False, ignore_eos=True))
                for _ in range(500):  # until 3 tokens are out (bounded)
                    if engine.engine.loads().used_tokens >= len(PROMPT) + 3:
                        break
                    await asyncio.sleep(0.01)
                await stub.Abort(pb.AbortRequest(request_ids=["a2"]))
                replies = [reply async for reply in call]
        assert len(replies) == 1 and replies[0].complete.finish_reason == "abort"
        assert replies[0].complete.completion_tokens >= 3


class TestInfo:
    async def test_health_check(self, vllm: Any) -> None:
        assert (await vllm.HealthCheck(pb.HealthCheckRequest())).healthy

    async def test_model_info(self, vllm: Any, vllm_engine: MockEngineServer) -> None:
        info = await vllm.GetModelInfo(pb.GetModelInfoRequest())
        assert info.is_generation and info.served_model_name == "deepseek-mock"
        assert info.max_context_length == vllm_engine.config.context_length
        assert info.tokenizer_path == info.model_path  # the served bundle, unpacked
        assert (Path(info.tokenizer_path) / "tokenizer_config.json").is_file()
        assert list(info.eos_token_ids) == [EOS] and info.vocab_size == 129280
        assert info.model_type == "deepseek_v3"

    async def test_server_info(self, vllm: Any, vllm_engine: MockEngineServer) -> None:
        info = await vllm.GetServerInfo(pb.GetServerInfoRequest())
        assert info.server_type == ""  # as vLLM 0.32's servicer (tests/fixtures/vllm_real.json)
        assert info.constrained_decoding_start == "first_token"
        assert (info.kv_role, info.kv_connector, info.kv_engine_id) == ("", "", "")
        assert info.block_size == vllm_engine.config.block_size
        assert info.data_parallel_size == 1 and info.max_num_seqs > 0

    @pytest.mark.parametrize(
        ("role", "kv_role"), [("prefill", "kv_producer"), ("decode", "kv_consumer")]
    )
    async def test_role_is_reported(self, role: str, kv_role: str) -> None:
        async with start_mock_engine(MockEngineConfig(protocol="vllm", port=0, role=role)) as e:
            async with grpc.aio.insecure_channel(e.target) as channel:
                info = await pb_grpc.VllmEngineStub(channel).GetServerInfo(
                    pb.GetServerInfoRequest()
                )
        assert info.kv_role == kv_role and info.kv_connector and info.kv_engine_id

    async def test_loads(self, vllm: Any) -> None:
        loads = await vllm.GetLoads(pb.GetLoadsRequest())
        assert len(loads.loads) == 1 and loads.loads[0].num_running_reqs == 0
