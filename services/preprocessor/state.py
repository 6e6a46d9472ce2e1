"""The preprocessor's object graph and lifecycle: fleet follower, router and dispatcher
clients, the tokenizer, and the model catalog derived from fleet's instance set."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import zmq.asyncio

from switchyard.common.engines.tls import EngineTls
from switchyard.common.fleet_admin import fleet_admin
from switchyard.common.fleet_client import FleetClient
from switchyard.common.flow.config import FlowConfig
from switchyard.common.replicas import RESOLVE_INTERVAL_S
from switchyard.preprocessor.access_log import AccessLog
from switchyard.preprocessor.admission import Admission, AdmissionCollector
from switchyard.preprocessor.admission import Limits as AdmissionLimits
from switchyard.preprocessor.auth import Access, KeyRing
from switchyard.preprocessor.catalog import ModelEntry, build_catalog
from switchyard.preprocessor.dispatcher_client import DispatcherClient
from switchyard.preprocessor.flow_client import FlowClient, FlowClientCollector
from switchyard.preprocessor.metrics import PreprocessorMetrics, UpstreamsCollector
from switchyard.preprocessor.parsers import ParserChoice, parsers_for
from switchyard.preprocessor.router_client import RouterClient
from switchyard.preprocessor.stages.context import Deps, Limits
from switchyard.preprocessor.stages.timing import StageTimer
from switchyard.preprocessor.storage.config import StoreConfig
from switchyard.preprocessor.storage.service import Storage, open_storage
from switchyard.preprocessor.tokenizer import OFFLOAD_CHARS, TokenizerBundle
from switchyard.preprocessor.tokenizer_source import ModelTokenizers
from switchyard.protos.messages import WorkerAdminReply, WorkerAdminRequest

if TYPE_CHECKING:
    from switchyard.preprocessor.tracing import Tracing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreprocessorConfig:
    routers: list[str]
    dispatchers: list[str]
    fleet_control: str
    fleet_events: str
    tokenizer_dir: Path | None = None  # for every model (else fetched from its engines)
    tokenizer_dirs: dict[str, Path] = field(default_factory=dict)  # per model
    # Output parser names (--tool-call-parser / --reasoning-parser): "" for every model,
    # else per model; a model without one gets the guess from its tokenizer files.
    tool_parsers: dict[str, str] = field(default_factory=dict)
    reasoning_parsers: dict[str, str] = field(default_factory=dict)
    route_timeout: float = 5.0
    stream_idle_timeout: float = 60.0  # for an attempt's first token
    stream_gap_timeout: float = 5.0  # between tokens, once they flow
    engine_streaming: str = "auto"  # auto: non-streamed requests go whole; always: stream
    dispatcher_wait: float = 30.0  # for a connected dispatcher (one restarting)
    resolve_interval: float = RESOLVE_INTERVAL_S  # router and dispatcher names looked up again
    migration_limit: int = 3
    tokenize_offload_chars: int = OFFLOAD_CHARS
    listen_when_ready_s: float = 0.0  # >0: start listening once ready (or after this long)
    stage_timing: bool = False
    access_log: bool = True  # one INFO line per API request (switchyard.access)
    otlp_endpoint: str | None = None  # tracing: OTLP/gRPC collector; None: tracing off
    trace_sample_ratio: float = 1.0  # of the traces that start here (a client's flag wins)
    instance: str = ""  # this process's URL (logs, trace resource)
    engine_tls: EngineTls | None = None  # grpcs:// engines (GetTokenizer)
    request_timeout: float = 0.0  # a request's total deadline (0: none)
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    flow: FlowConfig | None = None  # --flow-config: the deployment's flow gate
    shutdown_grace: float = 30.0  # SIGTERM: in-flight requests may finish this long
    admin_timeout: float = 5.0  # for fleet to answer an admin call
    # Stored responses and conversations (none here; the CLI's default is SQLite).
    store: StoreConfig = field(default_factory=lambda: StoreConfig(backend="none"))

    def __post_init__(self) -> None:
        if not self.dispatchers or not self.routers:
            raise ValueError("at least one router and one dispatcher endpoint are needed")
        timeouts = (self.route_timeout, self.stream_idle_timeout, self.stream_gap_timeout)
        if not all(t > 0 for t in timeouts):  # NaN too: no comparison would ever fire
            raise ValueError("timeouts must be positive")
        if self.dispatcher_wait < 0:
            raise ValueError("--dispatcher-wait must be >= 0")
        if not 0 < self.resolve_interval < float("inf"):
            raise ValueError("--resolve-interval must be a finite number > 0")
        if self.engine_streaming not in ("auto", "always"):
            raise ValueError("--engine-streaming must be auto or always")
        if self.migration_limit < 0:
            raise ValueError("--migration-limit must be >= 0")
        if self.tokenize_offload_chars < 0:
            raise ValueError("--tokenize-offload-chars must be >= 0")
        if not 0.0 <= self.trace_sample_ratio <= 1.0:
            raise ValueError("--trace-sample-ratio must be within [0, 1]")
        if not 0 <= self.request_timeout < float("inf"):
            raise ValueError("--request-timeout must be >= 0 (0: no deadline)")
        if not 0 <= self.shutdown_grace < float("inf"):
            raise ValueError("--shutdown-grace must be >= 0")


@dataclass
class PreprocessorState:
    config: PreprocessorConfig
    catalog: dict[str, ModelEntry] = field(default_factory=dict)
    access: Access = field(default_factory=lambda: Access(KeyRing()))

    def __post_init__(self) -> None:
        cfg = self.config
        self.fleet = FleetClient(cfg.fleet_control, cfg.fleet_events, on_change=self._on_change)
        self.metrics = PreprocessorMetrics()
        self.router = RouterClient(
            cfg.routers, lambda: self.fleet.instances, resolve_interval=cfg.resolve_interval
        )
        self.dispatcher = DispatcherClient(
            cfg.dispatchers, cfg.dispatcher_wait, resolve_interval=cfg.resolve_interval
        )
        self._parser_choices: dict[tuple[str, int], ParserChoice] = {}
        self.tokenizers = ModelTokenizers(
            lambda: self.fleet.instances, cfg.tokenizer_dir, cfg.tokenizer_dirs, tls=cfg.engine_tls
        )
        self.admission = Admission(cfg.admission)
        self.storage: Storage | None = open_storage(cfg.store, self.metrics.registry)
        self.metrics.registry.register(AdmissionCollector(self.admission))
        self.metrics.registry.register(
            UpstreamsCollector(
                {"router": self.router.replicas, "dispatcher": self.dispatcher.replicas}
            )
        )
        self.flow: FlowClient | None = None
        if cfg.flow is not None:
            self.flow = FlowClient(cfg.flow, self.router, cfg.instance, cfg.route_timeout)
            self.metrics.registry.register(FlowClientCollector(self.flow))
        self._zmq: zmq.asyncio.Context | None = None  # the admin calls' sockets (lazily)
        self._tasks: list[asyncio.Task[None]] = []
        # Files watched while serving (name, the watch loop): the TLS certificate files.
        self.watches: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = []
        self.stopping = asyncio.Event()  # a SIGTERM came (set by the server)
        self.deps = Deps(
            router=self.router,
            dispatcher=self.dispatcher,
            catalog=lambda: self.catalog,
            tokenizer=self.tokenizers.get,
            instances=lambda: self.fleet.instances,
            parsers=self._parsers,
            metrics=self.metrics,
            limits=Limits(
                route_timeout=cfg.route_timeout,
                first_token_timeout=cfg.stream_idle_timeout,
                gap_timeout=cfg.stream_gap_timeout,
                migration_limit=cfg.migration_limit,
                offload_chars=cfg.tokenize_offload_chars,
                whole_replies=cfg.engine_streaming == "auto",
            ),
            timer=StageTimer(self.metrics.stage_seconds) if cfg.stage_timing else None,
            tracing=self._tracing(),
            storage=self.storage,
            flow=self.flow,
        )
        self.access_log = AccessLog(lambda: self.fleet.instances) if cfg.access_log else None

    def _tracing(self) -> Tracing | None:
        cfg = self.config
        if cfg.otlp_endpoint is None:
            return None  # OpenTelemetry is not even imported
        from switchyard.preprocessor.tracing import Tracing

        return Tracing.otlp(cfg.otlp_endpoint, cfg.trace_sample_ratio, cfg.instance)

    def _parsers(self, model: str, bundle: TokenizerBundle) -> ParserChoice:
        """The model's output parsers, chosen once per tokenizer bundle."""
        key = (model, id(bundle))
        found = self._parser_choices.get(key)
        if found is None:
            cfg = self.config
            found = parsers_for(
                bundle.model_config,
                bundle.chat_template.source,
                cfg.tool_parsers.get(model, cfg.tool_parsers.get("")),
                cfg.reasoning_parsers.get(model, cfg.reasoning_parsers.get("")),
            )
            self._parser_choices = {k: v for k, v in self._parser_choices.items() if k[0] != model}
            self._parser_choices[key] = found
        return found

    def _on_change(self, events: object) -> None:
        self.catalog = build_catalog(self.fleet.instances)
        self.tokenizers.sync(self.catalog)

    async def admin(self, request: WorkerAdminRequest) -> WorkerAdminReply:
        """One call to fleet's admin API (FleetAdminError when fleet does not answer)."""
        if self._zmq is None:
            self._zmq = zmq.asyncio.Context()
        return await fleet_admin(
            self._zmq, self.config.fleet_control, request, self.config.admin_timeout
        )

    def not_ready_reason(self) -> str:
        """Ready when a request could succeed now: some served model has a routable engine
        and its tokenizer, a router answers (or the local fallback can place it), and a
        dispatcher is connected."""
        if not self.catalog:
            return "no engine is routable"
        servable = self.tokenizers.loaded() & self.catalog.keys()
        if not servable:
            return "the tokenizer is not loaded yet"
        if not self.dispatcher.connected():
            return "no dispatcher is reachable"
        if not self.router.connected() and not any(
            self.router.fallback.can_route(model) for model in servable
        ):
            return "no router is reachable (and the local fallback has no engine to use)"
        return ""

    def models_body(self) -> bytes:
        entries = sorted(self.catalog.values(), key=lambda e: e.name)
        return orjson.dumps({"object": "list", "data": [_model_object(e) for e in entries]})

    def model_body(self, name: str) -> bytes | None:
        """GET /v1/models/{name}: the object /v1/models lists for it; None: not served."""
        entry = self.catalog.get(name)
        return None if entry is None else orjson.dumps(_model_object(entry))

    async def _until_ready(self, timeout: float) -> None:
        """Hold the start-up (uvicorn listens after it) until this process can serve: with
        SO_REUSEPORT the kernel then sends connections only to ready preprocessors."""
        try:
            async with asyncio.timeout(timeout):
                while self.not_ready_reason() and not self.stopping.is_set():
                    await asyncio.sleep(0.05)
        except TimeoutError:
            log.warning(
                "listening although not ready after %gs: %s", timeout, self.not_ready_reason()
            )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        self.router.start()
        self.dispatcher.start()
        try:
            if self.storage is not None:
                await self.storage.start()  # a SQLite file that cannot be opened: no start
            if await self.fleet.start_unless_stopped(self.stopping):
                self.catalog = build_catalog(self.fleet.instances)
                self.tokenizers.sync(self.catalog)
                if self.access.keys.file is not None:
                    keys = asyncio.create_task(self.access.keys.watch(), name="api-keys")
                    self._tasks.append(keys)
                for name, watch in self.watches:
                    self._tasks.append(asyncio.create_task(watch(), name=name))
                if self.flow is not None:
                    self._tasks.append(asyncio.create_task(self.flow.run_sync(), name="flow"))
                if self.config.listen_when_ready_s > 0:
                    await self._until_ready(self.config.listen_when_ready_s)
            yield  # stopped first: the server exits as soon as the start-up ends
        finally:
            if self.deps.tracing is not None:
                self.deps.tracing.shutdown()  # exports the spans still pending
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.flow is not None:
                self.flow.close()
            if self._zmq is not None:
                self._zmq.term()
            if self.storage is not None:
                await self.storage.close()
            await self.tokenizers.close()
            await self.fleet.close()
            await self.router.close()
            await self.dispatcher.close()


def _model_object(entry: ModelEntry) -> dict[str, Any]:
    """OpenAI's model object, plus the context window (vLLM's `max_model_len`)."""
    return {
        "id": entry.name,
        "object": "model",
        "created": 0,
        "owned_by": "switchyard",
        "max_model_len": entry.context_length,
    }
