"""What the protocol servicers share: config, tokenizer facts, the core engine, the bundle, the
fault injector, the engine's disaggregation part and the output script; and the helpers both
servicers use (output plans, refusals, embeddings)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from switchyard.mock_engine import embedding
from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.data_parallel import DataParallelEngine
from switchyard.mock_engine.disagg import Disaggregation
from switchyard.mock_engine.faults import FaultInjector, Refusal
from switchyard.mock_engine.kv_events import KvEventPublisher
from switchyard.mock_engine.script import Script
from switchyard.mock_engine.structured import FixedPlan, TextPlan, compile_constraint
from switchyard.mock_engine.tokenizer_bundle import TokenizerBundle, bundle_slices
from switchyard.mock_engine.tokenizer_facts import TokenizerFacts
from switchyard.mock_engine.types import GenerationRequest, OutputPlan, SamplingSpec

logger = logging.getLogger(__name__)

# (kind, value, choices) of a request's constraint, as structured.compile_constraint takes it
ConstraintSpec = tuple[str, str, Sequence[str]]
NOT_GENERATION = "This model does not support generation"


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
    script: Script | None = None
    kv_publishers: tuple[KvEventPublisher, ...] = ()  # one per data-parallel rank
    tokenizer_dir: Path | None = None  # a folder holding exactly what GetTokenizer serves
    kv_events_config: str | None = None  # SGLang's server_args.kv_events_config, as bound

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

    def output_plan(
        self, prompt_ids: Sequence[int], constraint: ConstraintSpec | None
    ) -> OutputPlan | None:
        """The request's dictated output: its constraint's (ConstraintError if it cannot be
        built), else the script's rule for the prompt, else None."""
        if constraint is not None:
            kind, value, choices = constraint
            return TextPlan(compile_constraint(kind, value, choices), self.facts.encode_output)
        if self.script is not None:
            rule = self.script.match(self.facts.decode_prompt(tuple(prompt_ids)))
            if rule is not None:
                return FixedPlan(self.facts.encode_output(rule.output))
        return None

    async def embed(self, request_id: str, prompt_ids: Sequence[int]) -> list[float]:
        """An input's vector after its simulated prefill; RequestRejected for bad input (the
        generation checks: empty, too long, out of vocabulary)."""
        job = GenerationRequest(request_id, tuple(prompt_ids), SamplingSpec(max_new_tokens=1))
        self.engine.validate(job)
        await asyncio.sleep(self.engine.timing.first_token_s(len(prompt_ids)))
        return embedding.embed(prompt_ids, self.config.embedding_dim)


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


_JOINED_KEYS = ("x-request-id", "traceparent")


def log_request(
    deps: ServicerDeps, rpc: str, request_id: str, context: grpc.aio.ServicerContext
) -> None:
    """--log-requests: the call's request id and the metadata that joins it to the client."""
    if not deps.config.log_requests:
        return
    metadata = {k: v for k, v in (context.invocation_metadata() or ()) if k in _JOINED_KEYS}
    logger.info(
        "%s request_id=%s x-request-id=%s traceparent=%s",
        rpc,
        request_id,
        metadata.get("x-request-id", "-"),
        metadata.get("traceparent", "-"),
    )


async def refuse_if_faulted(deps: ServicerDeps, context: grpc.aio.ServicerContext) -> None:
    """End a Generate call at once when the fault injector refuses it."""
    verdict = deps.faults.admit()
    if verdict is not None:
        code, message = _REFUSALS[verdict]
        await context.abort(code, message)


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
