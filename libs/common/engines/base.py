"""The protocol-neutral engine interface every service codes against."""

from __future__ import annotations

import abc
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import grpc
from smg_grpc_proto.generated import common_pb2

from switchyard.common import errors
from switchyard.common.errors import EngineError
from switchyard.protos.messages import GenerateFinished, GenerateRequest, TokenDelta

# Tokenizer zips and server info can be several MB; generation messages are small.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 0),
    # Reconnect quickly after an engine restarts (the default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


@dataclass(frozen=True)
class EngineInfo:
    """What a probe learns about an engine. `role` is None when the engine does not say."""

    protocol: str
    model: str
    context_length: int
    block_size: int
    role: str | None = None
    bootstrap_port: int | None = None
    kv_events_endpoint: str | None = None
    kv_replay_endpoint: str | None = None
    max_running_requests: int = 0
    tokenizer_path: str = ""
    local_prefill: bool = True  # False: the engine only decodes transferred KV
    dp_size: int = 1  # data-parallel ranks (each its own KV cache and KV-event publisher)


@dataclass(frozen=True)
class EngineLoad:
    running: int
    waiting: int


GenerateEvent: TypeAlias = TokenDelta | GenerateFinished


class EngineClient(abc.ABC):
    """One engine behind one gRPC channel. Methods raise EngineError with a kind."""

    protocol: ClassVar[str]
    service_name: ClassVar[str]

    def __init__(self, channel: grpc.aio.Channel, instance_id: int | None = None) -> None:
        self.channel = channel
        self.instance_id = instance_id

    async def close(self) -> None:
        await self.channel.close()

    def _error(self, exc: BaseException) -> EngineError:
        return EngineError.from_exception(exc, self.instance_id)

    # The family's generated message module (HealthCheckRequest, GetLoadsRequest, ...): both
    # families name these RPCs and messages alike.
    proto: ClassVar[Any]
    stub: Any

    async def health(self, timeout: float) -> bool:
        try:
            reply = await self.stub.HealthCheck(self.proto.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from exc
        return bool(reply.healthy)

    async def _model_and_server_info(self, timeout: float) -> tuple[Any, Any]:
        try:
            proto = self.proto
            model = await self.stub.GetModelInfo(proto.GetModelInfoRequest(), timeout=timeout)
            server = await self.stub.GetServerInfo(proto.GetServerInfoRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from exc
        return model, server

    async def load(self, timeout: float) -> EngineLoad:
        try:
            reply = await self.stub.GetLoads(self.proto.GetLoadsRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from exc
        running = sum(load.num_running_reqs for load in reply.loads)
        waiting = sum(load.num_waiting_reqs for load in reply.loads)
        return EngineLoad(running, waiting)

    def _tokenizer_call(self, timeout: float) -> Any:
        return self.stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=timeout)

    @abc.abstractmethod
    async def info(self, timeout: float) -> EngineInfo: ...

    @abc.abstractmethod
    def build_request(self, request: GenerateRequest) -> Any:
        """The family's GenerateRequest message."""

    def _kv_transfer_params(self, done: Any) -> str | None:
        """What a prefill engine's final message hands to the decode side (vLLM only)."""
        return None

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateEvent]:
        """Token deltas, then exactly one GenerateFinished. Raises EngineError; a stream that
        ends without its final message raises kind `disconnected`.

        Both families send delta token ids in chunks, and a streamed `complete` repeats the
        last chunk's tokens, so its output ids count only when not streaming. Completion
        tokens are counted here: SGLang's counts are cumulative, vLLM's per chunk."""
        request_id = request.request_id
        call = self.stub.Generate(self.build_request(request))
        generated = 0
        try:
            async for reply in call:
                if reply.HasField("chunk"):
                    ids = reply.chunk.token_ids
                    if ids:
                        generated += len(ids)
                        yield TokenDelta(request_id, list(ids))
                elif reply.HasField("complete"):
                    done = reply.complete
                    matched = done.matched_token_id if done.HasField("matched_token_id") else None
                    if not request.stream and done.output_ids:
                        generated += len(done.output_ids)
                        yield TokenDelta(request_id, list(done.output_ids))
                    yield GenerateFinished(
                        request_id=request_id,
                        finish_reason=done.finish_reason or "stop",
                        prompt_tokens=done.prompt_tokens,
                        completion_tokens=generated,
                        cached_tokens=done.cached_tokens,
                        matched_token_id=matched,
                        kv_transfer_params_json=self._kv_transfer_params(done),
                    )
                    return
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from exc
        finally:
            call.cancel()
        raise EngineError(errors.DISCONNECTED, "stream ended without complete", self.instance_id)

    @abc.abstractmethod
    async def abort(self, request_id: str, timeout: float = 2.0) -> None: ...

    async def fetch_tokenizer(self, timeout: float = 30.0) -> bytes:
        """The engine's tokenizer zip, checked against the sha256 on its last chunk."""
        parts: list[bytes] = []
        digest = ""
        try:
            async for chunk in self._tokenizer_call(timeout):
                parts.append(chunk.data)
                if chunk.sha256:
                    digest = chunk.sha256
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from exc
        data = b"".join(parts)
        if not digest or hashlib.sha256(data).hexdigest() != digest.lower():
            raise EngineError(
                errors.ENGINE_ERROR, "tokenizer zip missing or failing its sha256", self.instance_id
            )
        return data
