"""The server: standard health service names, and the core's request count."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from switchyard.mock_engine.server import MockEngineServer

pytestmark = pytest.mark.asyncio(loop_scope="module")


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
