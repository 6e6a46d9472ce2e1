"""What the protocol servicers share: config, tokenizer facts, the core engine, the bundle, the
fault injector and the engine's disaggregation part."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.data_parallel import DataParallelEngine
from switchyard.mock_engine.disagg import Disaggregation
from switchyard.mock_engine.faults import FaultInjector, Refusal
from switchyard.mock_engine.kv_events import KvEventPublisher
from switchyard.mock_engine.tokenizer_bundle import TokenizerBundle, bundle_slices
from switchyard.mock_engine.tokenizer_facts import TokenizerFacts


@dataclasses.dataclass(frozen=True, eq=False)
class ServicerDeps:
    config: MockEngineConfig
    facts: TokenizerFacts
    engine: DataParallelEngine
    kv_events: KvEventPublisher  # rank 0's
    bundle: TokenizerBundle
    model_config: dict[str, Any]  # config.json as served
    port: int  # the bound port (the config's may be 0)
    start_time: float  # wall clock
    faults: FaultInjector
    disagg: Disaggregation
    wall_clock: Callable[[], float] = time.time
    kv_publishers: tuple[KvEventPublisher, ...] = ()  # one per data-parallel rank
    tokenizer_dir: Path | None = None  # a folder holding exactly what GetTokenizer serves

    @property
    def tokenizer_path(self) -> str:
        """What GetModelInfo reports as tokenizer_path / model_path."""
        return str(self.tokenizer_dir or self.facts.directory)

    @property
    def model_type(self) -> str:
        return str(self.model_config.get("model_type") or "")

    @property
    def architectures(self) -> list[str]:
        return [str(a) for a in self.model_config.get("architectures") or []]

    def uptime_s(self) -> float:
        return max(0.0, self.wall_clock() - self.start_time)


_REFUSALS = {
    Refusal.UNAVAILABLE: (
        grpc.StatusCode.UNAVAILABLE,
        "mock engine: injected fault (--fail-unavailable): engine unavailable",
    ),
    Refusal.OVERLOADED: (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "mock engine: injected fault (--fail-overloaded): engine overloaded, retry later",
    ),
}


async def refuse_if_faulted(deps: ServicerDeps, context: grpc.aio.ServicerContext) -> None:
    """End a Generate call at once when the fault injector refuses it."""
    verdict = deps.faults.admit()
    if verdict is not None:
        code, message = _REFUSALS[verdict]
        await context.abort(code, message)


async def unimplemented(context: grpc.aio.ServicerContext, what: str) -> None:
    message = f"{what} is not supported by the mock engine"
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)


async def tokenizer_slices(
    deps: ServicerDeps, context: grpc.aio.ServicerContext
) -> AsyncIterator[tuple[bytes, str]]:
    """The archive's slices for GetTokenizer; INTERNAL when it cannot be built."""
    try:
        data, sha256 = await deps.bundle.archive()
    except OSError as exc:
        await context.abort(grpc.StatusCode.INTERNAL, f"cannot build the tokenizer bundle: {exc}")
    for piece in bundle_slices(data, sha256):
        yield piece
