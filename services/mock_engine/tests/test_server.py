"""The server: standard health service names, the warm-up, and the core's request count."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc

from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import MockEngineServer, start_mock_engine

pytestmark = pytest.mark.asyncio(loop_scope="module")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def status(target: str, service: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        return reply.status


class TestHealth:
    async def test_sglang_services_serving(self, sglang_engine: MockEngineServer) -> None:
        for service in ("", "sglang.grpc.scheduler.SglangScheduler"):
            assert (
                await status(sglang_engine.target, service)
                == health_pb2.HealthCheckResponse.SERVING
            )

    async def test_vllm_services_serving(self, vllm_engine: MockEngineServer) -> None:
        for service in ("", "vllm.grpc.engine.VllmEngine"):
            assert (
                await status(vllm_engine.target, service) == health_pb2.HealthCheckResponse.SERVING
            )

    async def test_unknown_service_is_not_found(self, vllm_engine: MockEngineServer) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await status(vllm_engine.target, "sglang.grpc.scheduler.SglangScheduler")
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


class TestWarmUp:
    """--warm-up-requests: the real vLLM servicer's warm-up (fixtures/vllm_real.json)."""

    async def test_not_serving_until_warmed_up_and_the_reset_published_late(self) -> None:
        config = MockEngineConfig(
            protocol="vllm", port=0, context_length=512, warm_up_requests=3, warm_up_ms=300
        )
        async with start_mock_engine(config) as server:
            assert server.warming_up is not None and server.engine is not None
            for service in ("", "vllm.grpc.engine.VllmEngine"):
                assert await status(server.target, service) == NOT_SERVING
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
                reply = await stub.HealthCheck(vllm_engine_pb2.HealthCheckRequest())
                assert reply.healthy  # the servicer's own check passes during the warm-up
                await server.warming_up
                for service in ("", "vllm.grpc.engine.VllmEngine"):
                    assert await status(server.target, service) == SERVING
                assert server.engine.cache.cached_blocks == 0
                assert server.kv_events is not None
                kinds = [type(e).__name__ for b in server.kv_events.buffered() for e in b.events]
                assert kinds == ["BlockStored"] * 3  # 4 blocks each; no clear published yet
                request = vllm_engine_pb2.GenerateRequest(
                    request_id="after",
                    tokenized=vllm_engine_pb2.TokenizedInput(input_ids=list(range(100, 140))),
                    sampling_params=vllm_engine_pb2.SamplingParams(max_tokens=1),
                )
                async for _ in stub.Generate(request):
                    pass
            kinds = [type(e).__name__ for b in server.kv_events.buffered() for e in b.events]
            assert kinds[3] == "AllBlocksCleared"
