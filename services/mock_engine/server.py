"""Builds and runs one mock engine: the grpc.aio server, its protocol servicer and health, per
data-parallel rank a core engine with its prefix cache and KV event publisher (ZMQ PUB and
replay ROUTER when configured, rank r at base port + r), the fault injector, the tokenizer
folder it reports, and the KV transfer port of a prefill engine (SGLang bootstrap / vLLM side
channel).

In-process use (tests):

    async with start_mock_engine(MockEngineConfig(protocol="sglang", port=0)) as engine:
        channel = grpc.aio.insecure_channel(engine.target)   # engine.port is the bound port
        engine.kv_transfer_port, engine.kv_transfers.handed_over   # disaggregation
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from smg_grpc_proto import sglang_scheduler_pb2_grpc, vllm_engine_pb2_grpc

from switchyard.common.ports import PortRange, bind_in_range, tcp_endpoint_port
from switchyard.mock_engine import sglang_servicer, vllm_servicer
from switchyard.mock_engine.config import (
    KV_EVENTS_HWM,
    WARM_UP_PROMPT_BLOCKS,
    EngineProtocol,
    MockEngineConfig,
)
from switchyard.mock_engine.data_parallel import DataParallelEngine
from switchyard.mock_engine.deps import ServicerDeps
from switchyard.mock_engine.disagg import Disaggregation
from switchyard.mock_engine.faults import FaultInjector
from switchyard.mock_engine.generation import MockEngine
from switchyard.mock_engine.kv_cache import SGLANG_POLICY, VLLM_POLICY, EngineHasher, PrefixCache
from switchyard.mock_engine.kv_events import KvEventPublisher
from switchyard.mock_engine.kv_handover import TransferCounters
from switchyard.mock_engine.kv_wire import WireEncoder
from switchyard.mock_engine.kv_zmq import KvZmqTransport, follow_rank0, rank_endpoint
from switchyard.mock_engine.tokenizer_bundle import TokenizerBundle, served_model_config
from switchyard.mock_engine.tokenizer_facts import load_tokenizer_facts
from switchyard.mock_engine.tokens import TokenOracle
from switchyard.mock_engine.types import AllBlocksCleared

logger = logging.getLogger(__name__)

_DP_BASE_TRIES = 8  # port-0 bases tried for data-parallel ranks (base + r must all be free)

# The gRPC server options of the stock servers, family by family (clients may rely on them:
# keepalive pings every 10 s are accepted, messages of these sizes pass).
# SGLang: smg-grpc-servicer's sglang/server.py (0.14).
SGLANG_SERVER_OPTIONS: list[tuple[str, int | bool]] = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.http2.min_ping_interval_without_data_ms", 10000),
    ("grpc.keepalive_permit_without_calls", True),
]
# vLLM: vllm/entrypoints/launchers/grpc_server.py (0.30 and later).
VLLM_SERVER_OPTIONS: list[tuple[str, int | bool]] = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 10000),
    ("grpc.keepalive_permit_without_calls", True),
]
# Not a client-visible option: gRPC binds with SO_REUSEPORT by default, so a port another
# gRPC server holds would be silently shared; the mock must fail instead (and search on).
_EXCLUSIVE_BIND = ("grpc.so_reuseport", 0)


def server_options(protocol: EngineProtocol) -> list[tuple[str, int | bool]]:
    family = SGLANG_SERVER_OPTIONS if protocol is EngineProtocol.SGLANG else VLLM_SERVER_OPTIONS
    return [*family, _EXCLUSIVE_BIND]


def server_credentials(config: MockEngineConfig) -> grpc.ServerCredentials | None:
    """TLS credentials from --tls-cert/--tls-key (and --tls-client-ca: mutual TLS); None:
    plaintext."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    client_ca = config.tls_client_ca.read_bytes() if config.tls_client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


SERVICE_NAMES = {
    EngineProtocol.SGLANG: sglang_servicer.SERVICE_NAME,
    EngineProtocol.VLLM: vllm_servicer.SERVICE_NAME,
}


class MockEngineServer:
    """One mock engine: `start()` binds and serves, `stop()` drains and shuts down."""

    def __init__(
        self,
        config: MockEngineConfig,
        *,
        rng: random.Random | None = None,
        ports: PortRange | None = None,
    ) -> None:
        self.config = config
        self._ports = ports  # where a port 0 (gRPC, KV event sockets) is searched
        self._rng = rng
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self.engine: DataParallelEngine | None = None
        self.kv_events: KvEventPublisher | None = None  # rank 0's publisher
        self.kv_publishers: list[KvEventPublisher] = []  # one per data-parallel rank
        self._zmq: KvZmqTransport | None = None
        self._transports: list[KvZmqTransport] = []
        self.disagg: Disaggregation | None = None
        self.faults: FaultInjector | None = None
        self.port = 0
        self.warming_up: asyncio.Task[None] | None = None  # --warm-up-requests, while it runs

    @property
    def service_name(self) -> str:
        return SERVICE_NAMES[self.config.protocol]

    @property
    def target(self) -> str:
        """host:port to dial."""
        return f"{self.config.host}:{self.port}"

    @property
    def kv_events_endpoint(self) -> str | None:
        """The PUB socket's bound endpoint (`tcp://127.0.0.1:*` resolved to its port)."""
        return self._zmq.bound_endpoint if self._zmq is not None else None

    @property
    def kv_replay_endpoint(self) -> str | None:
        return self._zmq.bound_replay_endpoint if self._zmq is not None else None

    @property
    def kv_events_endpoints(self) -> list[str | None]:
        """Each rank's PUB endpoint (bound, or connected to)."""
        return [t.bound_endpoint for t in self._transports]

    @property
    def kv_replay_endpoints(self) -> list[str | None]:
        return [t.bound_replay_endpoint for t in self._transports]

    @property
    def kv_transfer_port(self) -> int:
        """The bound bootstrap port (SGLang prefill) / side channel (vLLM producer); else 0."""
        return self.disagg.port if self.disagg is not None else 0

    @property
    def kv_transfers(self) -> TransferCounters:
        """Handovers done (prefill side) and received (decode side) since start."""
        return self.disagg.counters if self.disagg is not None else TransferCounters()

    def _build_faults(self) -> FaultInjector:
        config = self.config
        seed = config.fault_seed
        return FaultInjector(
            exit_after_tokens=config.exit_after_tokens,
            hang_after_tokens=config.hang_after_tokens,
            fail_unavailable=config.fail_unavailable,
            fail_overloaded=config.fail_overloaded,
            rng=random.Random(seed) if seed is not None else None,
        )

    async def _start_transports(self, publishers: list[KvEventPublisher]) -> list[KvZmqTransport]:
        """One transport per rank, started. Rank r binds base port + r; with a port 0, rank 0
        binds a free one and the others follow it, and a base whose next ports are taken is
        given up for another (a few tries)."""
        config = self.config
        events, replay = config.kv_events_endpoint, config.kv_replay_endpoint
        searched = len(publishers) > 1 and any(
            e is not None and (p := tcp_endpoint_port(e)) is not None and p[1] == 0
            for e in (events, replay)
        )
        for attempt in range(_DP_BASE_TRIES if searched else 1):
            started: list[KvZmqTransport] = []
            base_events, base_replay = events, replay
            try:
                for rank, publisher in enumerate(publishers):
                    followed = rank > 0 and base_events != events  # a port 0 resolved by rank 0
                    transport = KvZmqTransport(
                        publisher,
                        endpoint=rank_endpoint(base_events, rank) if base_events else None,
                        replay_endpoint=rank_endpoint(base_replay, rank) if base_replay else None,
                        topic=config.kv_events_topic,
                        replay_topic_frame=config.kv_replay_topic_frame,
                        skip_seqs=config.kv_skip_seqs,
                        hwm=KV_EVENTS_HWM,
                        ports=self._ports,
                        bind=True if followed else None,
                    )
                    transport.start()
                    started.append(transport)
                    if rank == 0:
                        if events is not None and not transport.connects:
                            base_events = follow_rank0(events, transport.bound_endpoint)
                        if replay is not None:
                            base_replay = follow_rank0(replay, transport.bound_replay_endpoint)
                return started
            except OSError:
                for transport in started:
                    await transport.stop()
                if attempt == _DP_BASE_TRIES - 1 or not searched:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _build_cache(self, seed: int) -> PrefixCache:
        config = self.config
        policy = VLLM_POLICY if config.protocol is EngineProtocol.VLLM else SGLANG_POLICY
        return PrefixCache(
            block_size=config.block_size,
            num_blocks=config.num_blocks,
            hasher=EngineHasher(seed),
            policy=policy,
        )

    async def start(self) -> int:
        """Load the tokenizer (off the loop), bind, serve; returns the bound port."""
        config = self.config
        facts = await asyncio.to_thread(load_tokenizer_facts, config.tokenizer_path)
        bundle = TokenizerBundle(facts, config.context_length)
        tokenizer_dir = await bundle.directory()
        faults = self._build_faults()
        seed = config.kv_hash_seed
        if seed is None:
            seed = (self._rng or random.Random()).getrandbits(64)
        publishers: list[KvEventPublisher] = []
        ranks: list[MockEngine] = []
        for rank in range(config.dp_size):
            publisher = KvEventPublisher(
                encode=WireEncoder(
                    config.kv_events_format,
                    config.kv_hash_form,
                    rank,
                    vllm_keys=config.protocol == EngineProtocol.VLLM,
                ),
                buffer_steps=config.kv_replay_buffer,
            )
            publishers.append(publisher)
            ranks.append(
                MockEngine(
                    oracle=TokenOracle(facts.ordinary_ids, facts.eos_token_id),
                    vocab_size=facts.vocab_size,
                    context_length=config.context_length,
                    cache=self._build_cache(seed),  # one hashing for all ranks of an engine
                    timing=config.timing,
                    token_text=facts.text_of,
                    events=publisher,
                    faults=faults,
                    rng=self._rng,
                )
            )
        engine = DataParallelEngine(ranks)
        server = grpc.aio.server(options=server_options(config.protocol))

        credentials = server_credentials(config)

        def bind(candidate: int) -> int:
            address = f"{config.host}:{candidate}"
            try:
                if credentials is None:
                    bound = server.add_insecure_port(address)
                else:
                    bound = server.add_secure_port(address, credentials)
            except RuntimeError as exc:  # grpc: "Failed to bind to address"
                raise OSError(f"cannot bind {config.host}:{candidate}: {exc}") from None
            if bound == 0:
                raise OSError(f"cannot bind {config.host}:{candidate}")
            return int(bound)

        port = bind(config.port) if config.port else bind_in_range(bind, self._ports)
        disagg = Disaggregation(config, engine)
        try:  # before serving: a bind failure leaves nothing
            transports = await self._start_transports(publishers)
        except OSError:
            await server.stop(None)
            raise
        try:
            await disagg.start()
        except OSError:
            for transport in transports:
                await transport.stop()
            await server.stop(None)
            raise
        if config.protocol is EngineProtocol.SGLANG:
            for publisher in publishers:
                publisher.publish_now([AllBlocksCleared()])  # SGLang's sequence 0 at start
        deps = ServicerDeps(
            config=config,
            facts=facts,
            engine=engine,
            kv_events=publishers[0],
            bundle=bundle,
            model_config=served_model_config(facts, config.context_length),
            port=port,
            start_time=time.time(),
            faults=faults,
            disagg=disagg,
            script=config.script,
            kv_publishers=tuple(publishers),
            tokenizer_dir=tokenizer_dir,
            kv_events_config=config.sglang_kv_events_config(
                transports[0].bound_endpoint if transports else None,
                not transports[0].connects if transports else None,
                transports[0].bound_replay_endpoint if transports else None,
            ),
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
        try:
            await server.start()
        except BaseException:
            await disagg.stop()
            for transport in transports:
                await transport.stop()
            raise
        self._server, self._health, self.engine, self.port = server, health_servicer, engine, port
        if config.warm_up_requests:
            await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            self.warming_up = asyncio.create_task(self._warm_up(engine, facts.ordinary_ids))
        else:
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self.kv_events, self._zmq = publishers[0], transports[0]
        self.kv_publishers, self._transports = publishers, transports
        self.disagg, self.faults = disagg, faults
        logger.info(
            "mock engine ready protocol=%s port=%d host=%s model=%s role=%s kv_transfer_port=%d "
            "embedding=%s script_rules=%d tls=%s",
            config.protocol.value,
            port,
            config.host,
            config.model_name,
            config.role.value,
            disagg.port,
            config.embedding,
            len(config.script) if config.script is not None else 0,
            "mutual" if config.tls_client_ca else "on" if credentials else "off",
        )
        return port

    async def _set_health(self, status: int) -> None:
        assert self._health is not None
        for name in ("", self.service_name):
            await self._health.set(name, status)

    async def _warm_up(self, engine: DataParallelEngine, ordinary_ids: Sequence[int]) -> None:
        """The vLLM servicer's warm-up (smg-grpc-servicer's vllm/warmup.py): both health
        services NOT_SERVING while requests fill every rank's prefix cache (their
        BlockStored published), then the cache reset, whose AllBlocksCleared vLLM publishes
        only at its next step (services/mock_engine/tests/fixtures/vllm_real.json,
        "warm_up"), then SERVING. Generate calls are served meanwhile, as by the real one."""
        config = self.config
        started = time.monotonic()
        rng = random.Random(config.warm_up_requests)
        length = WARM_UP_PROMPT_BLOCKS * config.block_size
        prompts = [
            [rng.choice(ordinary_ids) for _ in range(length)]
            for _ in range(config.warm_up_requests)
        ]
        try:
            await asyncio.gather(*(rank.warm_up(prompts) for rank in engine.ranks))
            await asyncio.sleep(max(0.0, started + config.warm_up_s - time.monotonic()))
            # vLLM refuses the reset while requests run (a client's, served meanwhile).
            refused = sum(not rank.reset_prefix_cache() for rank in engine.ranks)
            logger.info(
                "warm-up done: %d requests in %.2fs, prefix cache reset on %d of %d ranks "
                "(its AllBlocksCleared goes out at the next step)",
                len(prompts),
                time.monotonic() - started,
                len(engine.ranks) - refused,
                len(engine.ranks),
            )
        except Exception:  # the real servicer serves without a warm-up that failed
            logger.exception("the warm-up failed; serving without it")
        if self._server is not None:  # not stopped meanwhile
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float = 5.0) -> None:
        """NOT_SERVING on health, then let running streams finish for up to `grace_s`."""
        server, self._server = self._server, None
        if server is None:
            return
        if self.warming_up is not None:
            self.warming_up.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.warming_up
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        for publisher in self.kv_publishers:
            publisher.close()  # ends SubscribeKvEvents streams, which never end by themselves
        if self.disagg is not None:
            self.disagg.board.close()  # prefill calls waiting for a pickup end now
        await server.stop(grace_s)
        if self.disagg is not None:
            await self.disagg.stop()
        for transport in self._transports:
            await transport.stop()
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
