"""Mock engines for the tests: one fast engine per protocol per test module, in process."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest_asyncio
from smg_grpc_proto import sglang_scheduler_pb2_grpc, vllm_engine_pb2_grpc

from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import MockEngineServer, start_mock_engine

FAST = {"port": 0, "speedup": 1000.0, "context_length": 512}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sglang_engine() -> AsyncIterator[MockEngineServer]:
    async with start_mock_engine(MockEngineConfig(protocol="sglang", **FAST)) as engine:
        yield engine
    assert engine.engine is not None and engine.engine.active_requests == 0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_engine() -> AsyncIterator[MockEngineServer]:
    async with start_mock_engine(MockEngineConfig(protocol="vllm", **FAST)) as engine:
        yield engine
    assert engine.engine is not None and engine.engine.active_requests == 0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sglang(sglang_engine: MockEngineServer) -> AsyncIterator[object]:
    async with grpc.aio.insecure_channel(sglang_engine.target) as channel:
        yield sglang_scheduler_pb2_grpc.SglangSchedulerStub(channel)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm(vllm_engine: MockEngineServer) -> AsyncIterator[object]:
    async with grpc.aio.insecure_channel(vllm_engine.target) as channel:
        yield vllm_engine_pb2_grpc.VllmEngineStub(channel)
