"""Builds and runs one mock engine: the grpc.aio server, its protocol servicer and health.

In-process use (tests):

    async with start_mock_engine(MockEngineConfig(protocol="sglang", port=0)) as engine:
        channel = grpc.aio.insecure_channel(engine.target)   # engine.port is the bound port
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from smg_grpc_proto import sglang_scheduler_pb2_grpc, vllm_engine_pb2_grpc

from switchyard.mock_engine import sglang_servicer, vllm_servicer
from switchyard.mock_engine.config import EngineProtocol, MockEngineConfig
from switchyard.mock_engine.deps import ServicerDeps
from switchyard.mock_engine.generation import MockEngine
from switchyard.mock_engine.tokenizer_bundle import TokenizerBundle, served_model_config
from switchyard.mock_engine.tokenizer_facts import load_tokenizer_facts
from switchyard.mock_engine.tokens import TokenOracle

logger = logging.getLogger(__name__)

SERVICE_NAMES = {
    EngineProtocol.SGLANG: sglang_servicer.SERVICE_NAME,
    EngineProtocol.VLLM: vllm_servicer.SERVICE_NAME,
}


class MockEngineServer:
    """One mock engine: `start()` binds and serves, `stop()` drains and shuts down."""

    def __init__(self, config: MockEngineConfig, *, rng: random.Random | None = None) -> None:
        self.config = config
        self._rng = rng
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self.engine: MockEngine | None = None
        self.port = 0

    @property
    def service_name(self) -> str:
        return SERVICE_NAMES[self.config.protocol]

    @property
    def target(self) -> str:
        """host:port to dial."""
        return f"{self.config.host}:{self.port}"

    async def start(self) -> int:
        """Load the tokenizer (off the loop), bind, serve; returns the bound port."""
        config = self.config
        facts = await asyncio.to_thread(load_tokenizer_facts, config.tokenizer_path)
        engine = MockEngine(
            oracle=TokenOracle(facts.ordinary_ids, facts.eos_token_id),
            vocab_size=facts.vocab_size,
            context_length=config.context_length,
            kv_pool_tokens=config.kv_pool_tokens,
            ttft_s=config.ttft_s,
            itl_s=config.itl_s,
            token_text=facts.text_of,
            rng=self._rng,
        )
        server = grpc.aio.server()
        port = server.add_insecure_port(f"{config.host}:{config.port}")
        if port == 0:
            raise OSError(f"cannot bind {config.host}:{config.port}")
        deps = ServicerDeps(
            config=config,
            facts=facts,
            engine=engine,
            bundle=TokenizerBundle(facts, config.context_length),
            model_config=served_model_config(facts, config.context_length),
            port=port,
            start_time=time.time(),
        )
        if config.protocol is EngineProtocol.SGLANG:
            sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server(
                sglang_servicer.SglangServicer(deps), server
            )
        else:
            vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(
                vllm_servicer.VllmServicer(deps), server
            )
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        await server.start()
        for name in ("", self.service_name):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server, self._health, self.engine, self.port = server, health_servicer, engine, port
        logger.info(
            "mock engine ready protocol=%s port=%d host=%s model=%s role=%s",
            config.protocol.value,
            port,
            config.host,
            config.model_name,
            config.role.value,
        )
        return port

    async def stop(self, grace_s: float = 5.0) -> None:
        """NOT_SERVING on health, then let running streams finish for up to `grace_s`."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        await server.stop(grace_s)
        logger.info("mock engine stopped port=%d", self.port)


@contextlib.asynccontextmanager
async def start_mock_engine(
    config: MockEngineConfig, *, rng: random.Random | None = None, grace_s: float = 1.0
) -> AsyncIterator[MockEngineServer]:
    """Serve a mock engine for the block's duration; yields the started server."""
    server = MockEngineServer(config, rng=rng)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s)
