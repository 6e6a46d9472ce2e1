"""The protocol-neutral engine interface every service codes against."""

from __future__ import annotations

import abc
import array
import asyncio
import contextlib
import hashlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias, TypeVar

import grpc
from grpc_health.v1 import health_pb2
from smg_grpc_proto.generated import common_pb2

from switchyard.common import errors
from switchyard.common.engines import wire
from switchyard.common.engines.http2 import Http2Streams, Relay, StreamCall, closed_error
from switchyard.common.errors import EngineError
from switchyard.protos.messages import (
    DeltaDetail,
    GenerateFinished,
    GenerateRequest,
    PromptLogprobs,
    TokenDelta,
    TokenLogprobs,
)

HEALTH_SERVICE = "grpc.health.v1.Health"

A = TypeVar("A")
B = TypeVar("B")

# Keepalive: a frozen engine (SIGSTOP, a hung host) keeps its TCP connection open, so only
# an unanswered HTTP/2 ping shows it: the transport closes and its calls fail UNAVAILABLE
# (cannot_connect: instance down, migrate). The stock servers accept a ping every 10 s
# without data (SGLang: min_ping_interval_without_data_ms 10000, permit_without_calls, and
# the default 2 ping strikes before GOAWAY too_many_pings; vLLM 0.30+: the same with
# max_ping_strikes 0). Pings come every 12 s (margin over the 10 s floor, so no strike
# ever) and only while calls are open: that is when a frozen engine costs something, and
# older vLLM servers (a misspelt option left them at 300 s) then strike nothing on idle
# channels. A frozen engine is noticed within 12 + 4 s; streams notice it sooner through
# the preprocessor's gap timeout.
KEEPALIVE_TIME_MS = 12_000
KEEPALIVE_TIMEOUT_MS = 4_000
# How long an UNAVAILABLE on a READY grpc.aio channel waits for the channel to leave READY
# before it counts as the engine's refusal (EngineClient._error): well over the lag between
# the two that gRPC core shows under load (docs/benchmarks.md, "Fault classification").
_SETTLE_S = 0.05

# Tokenizer zips and server info can be several MB; generation messages are small.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 0),
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
    kv_events_binds: bool = True  # False: the publisher connects to kv_events_endpoint
    kv_topic: str | None = None
    max_running_requests: int = 0
    tokenizer_path: str = ""
    local_prefill: bool = True  # False: the engine only decodes transferred KV
    is_generation: bool = True  # GetModelInfo.is_generation; False: an embedding model
    dp_size: int = 1  # data-parallel ranks (each its own KV cache and KV-event publisher)


@dataclass(frozen=True)
class EngineLoad:
    running: int
    waiting: int


@dataclass(frozen=True)
class Embedding:
    """One input's vector as little-endian float32 bytes (the proto's floats, unchanged)."""

    vector: bytes
    dimensions: int
    prompt_tokens: int


GenerateEvent: TypeAlias = TokenDelta | GenerateFinished


def _detail(
    index: int, logprobs: TokenLogprobs | None, prompt: PromptLogprobs | None
) -> DeltaDetail | None:
    if index == 0 and logprobs is None and prompt is None:
        return None
    return DeltaDetail(index, logprobs, prompt)


def call_metadata(
    http_request_id: str | None, traceparent: str | None
) -> tuple[tuple[str, str], ...] | None:
    """gRPC metadata that joins an engine call to the client's request: `x-request-id` (the
    HTTP request id) and the W3C `traceparent` (keys as SMG sends them to the engines)."""
    if http_request_id is None and traceparent is None:
        return None
    pairs = []
    if http_request_id is not None:
        pairs.append(("x-request-id", http_request_id))
    if traceparent is not None:
        pairs.append(("traceparent", traceparent))
    return tuple(pairs)


def _caller_cancelled() -> bool:
    """A CancelledError in a stream is the caller's when its task is being cancelled; else
    grpc.aio cancelled the call because its channel was closed under it."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _PlainReplies:
    """One choice, no logprobs (the per-token hot path): each Generate reply becomes its
    events. Both families send delta token ids in chunks; a streamed `complete` repeats the
    last chunk's tokens, so its output ids count only when not streaming."""

    __slots__ = ("request_id", "whole", "generated", "complete", "_finished")

    def __init__(
        self, request: GenerateRequest, finished: Callable[[str, Any, int], GenerateFinished]
    ) -> None:
        self.request_id = request.request_id
        self.whole = not request.stream
        self.generated = 0
        self.complete = False
        self._finished = finished

    def convert(self, reply: Any, emit: Callable[[Any], None]) -> bool:
        """Emit the reply's events; True once it was the final message."""
        if reply.HasField("chunk"):
            ids = reply.chunk.token_ids
            if ids:
                self.generated += len(ids)
                emit(TokenDelta(self.request_id, list(ids)))
            return False
        if not reply.HasField("complete"):
            return False
        done = reply.complete
        if self.whole and done.output_ids:
            self.generated += len(done.output_ids)
            emit(TokenDelta(self.request_id, list(done.output_ids)))
        emit(self._finished(self.request_id, done, self.generated))
        self.complete = True
        return True


async def both(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, Callable[[], B]]:
    """Two calls at once: on the HTTP/2 connection their requests go out in one write and
    their replies mostly come back in one read (fleet's probes wake once, not per call). The
    first's failure is raised here; the second's when its result is asked for (`second()`),
    so a caller that does not need it (an unhealthy engine) fails as it did one by one."""
    results = await asyncio.gather(first, second, return_exceptions=True)
    one, two = results[0], results[1]
    for failed in (one, two):  # a cancellation is never swallowed
        if isinstance(failed, asyncio.CancelledError):
            raise failed
    if isinstance(one, BaseException):
        raise one

    def result() -> B:
        if isinstance(two, BaseException):
            raise two
        return two

    return one, result


class EngineClient(abc.ABC):
    """One engine behind one gRPC channel. Methods raise EngineError with a kind.

    With `streams` (http2.Http2Streams), Generate streams (the dispatcher's per-token
    path) and the unary calls HealthCheck, GetModelInfo, GetServerInfo and GetLoads go over
    the loop's own HTTP/2 connection instead of the channel; Abort, Embed and GetTokenizer
    stay on the channel, which such a client opens at the first of them."""

    protocol: ClassVar[str]
    service_name: ClassVar[str]
    relay_layout: ClassVar[int]  # frames.SGLANG / frames.VLLM: where GenerateResponse's chunk is

    def __init__(
        self,
        channel: grpc.aio.Channel | Callable[[], grpc.aio.Channel],
        instance_id: int | None = None,
        streams: Http2Streams | None = None,
    ) -> None:
        """`channel`: the channel, or how to open it when a call first needs it (a client
        whose calls all go over `streams` never starts gRPC core's threads, whose timers
        wake an idle process several times a second: docs/benchmarks.md, "Idle wake-ups")."""
        if isinstance(channel, grpc.aio.Channel):
            self._channel: grpc.aio.Channel | None = channel
            self._open_channel: Callable[[], grpc.aio.Channel] | None = None
        else:
            self._channel, self._open_channel = None, channel
        self._stub: Any = None
        self.instance_id = instance_id
        self.streams = streams
        self.closed = False  # close() was called: every call on it fails (disconnected)
        if streams is not None:
            streams.instance_id = instance_id
            self._generate_path = f"/{self.service_name}/Generate"
            self._decode_reply = self.proto.GenerateResponse.FromString

    @property
    def channel(self) -> grpc.aio.Channel:
        channel = self._channel
        if channel is None:
            if self.closed:  # a call on a closed client, as grpc.aio's UsageError reads
                raise self._closed()
            assert self._open_channel is not None
            channel = self._channel = self._open_channel()
        return channel

    @property
    def stub(self) -> Any:
        """The family's generated stub on `channel` (opened on first use)."""
        stub = self._stub
        if stub is None:
            stub = self._stub = self.stub_class(self.channel)
        return stub

    async def close(self) -> None:
        self.closed = True
        if self.streams is not None:
            await self.streams.close()
        if self._channel is not None:
            await self._channel.close()

    async def _error(self, exc: grpc.aio.AioRpcError) -> EngineError:
        """A grpc.aio failure as an EngineError. An UNAVAILABLE is the engine refusing this
        call (kind refused) when the channel stays READY, else the transport's lost or
        never-opened connection (cannot_connect: instance down).

        The rule reads the channel's state, not the error's text: grpc.aio gives an
        engine's own UNAVAILABLE and one its transport made up the same code and the same
        shape of details and debug string (grpcio 1.85: "UNAVAILABLE:<details>" for both,
        no "Error received from peer" to tell them apart; a server's "Cancelling all calls"
        as it stops is one of the engine's own). A refusal leaves the connection READY; a
        refused or failed connect leaves the channel in TRANSIENT_FAILURE (or CONNECTING);
        a connection lost under the call (reset, GOAWAY, a server stopping, keepalive
        timeout) takes it out of READY, but gRPC core may deliver the call's error first,
        on a busy box a few milliseconds before the state moves. So an UNAVAILABLE on a
        READY channel waits up to
        `_SETTLE_S` for the state to move before it counts as a refusal; only refusals pay
        that wait (HTTP/2 streams, the default, read the frames' order and pay nothing). If
        the channel had already reconnected, the engine is answering again and not
        reporting it down is right."""
        connected = False
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            ready = grpc.ChannelConnectivity.READY
            connected = self.channel.get_state(try_to_connect=False) == ready
            if connected:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_SETTLE_S):
                        await self.channel.wait_for_state_change(ready)
                if self.closed:  # closed meanwhile (the instance was removed)
                    return self._closed()
                connected = self.channel.get_state(try_to_connect=False) == ready
        return EngineError.from_exception(exc, self.instance_id, connected)

    # The family's generated message module (HealthCheckRequest, GetLoadsRequest, ...): both
    # families name these RPCs and messages alike.
    proto: ClassVar[Any]
    stub_class: ClassVar[Any]  # the family's generated stub

    def _closed(self) -> EngineError:
        return closed_error(self.instance_id)

    async def _rpc(
        self,
        method: Any,
        request: Any,
        timeout: float | None,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> Any:
        """One unary call; every way it can fail is an EngineError. A channel closed under
        the call (the instance was removed) is kind `disconnected`: grpc.aio raises
        UsageError for a call on a closed channel and cancels the calls in flight, which
        must not pass for the caller's own cancellation (that would end the caller's loop,
        fleet's probes for one)."""
        async with self._engine_errors():
            return await method(request, timeout=timeout, metadata=metadata)

    async def _unary(
        self, method: str, request: Any, reply_type: Any, timeout: float, service: str = ""
    ) -> Any:
        """One unary call of `method`. A client with HTTP/2 streams makes it on that
        connection, a stream with one reply, and not through gRPC core, whose threads and
        timers cost more than the call (an idle router's load polls, fleet's probes:
        docs/benchmarks.md, "Engine connections"). Fails as `_rpc` does: EngineErrors,
        timeouts as kind timeout."""
        path = f"/{service or self.service_name}/{method}"
        streams = self.streams
        if streams is None:
            call_of = (
                self.channel.unary_unary(
                    path, type(request).SerializeToString, reply_type.FromString
                )
                if service
                else getattr(self.stub, method)
            )
            return await self._rpc(call_of, request, timeout)
        if self.closed:
            raise self._closed()
        call = streams.call(path, request.SerializeToString(), reply_type.FromString)
        try:
            async with asyncio.timeout(timeout):
                replies = [reply async for reply in call]
        except TimeoutError:
            call.cancel()
            raise EngineError(
                errors.TIMEOUT,
                f"DEADLINE_EXCEEDED: no answer to {method} in {timeout:g}s",
                self.instance_id,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ) from None
        except BaseException:
            call.cancel()
            raise
        if len(replies) != 1:
            why = f"{method} answered {len(replies)} messages, not one"
            raise EngineError(errors.ENGINE_ERROR, why, self.instance_id)
        return replies[0]

    @contextlib.asynccontextmanager
    async def _engine_errors(self) -> AsyncIterator[None]:
        """gRPC's failures as EngineErrors (see `_rpc`); not on the per-token path, whose
        loops keep their own handlers to stay one generator deep."""
        try:
            yield
        except grpc.aio.AioRpcError as exc:
            raise await self._error(exc) from exc
        except grpc.aio.UsageError:
            raise self._closed() from None
        except asyncio.CancelledError:
            if _caller_cancelled():
                raise
            raise self._closed() from None

    async def health(self, timeout: float) -> bool:
        """HealthCheck says healthy and the standard health service does not say NOT_SERVING
        for the engine's service: vLLM's servicer answers HealthCheck healthy while its
        planned warm-up still runs (a minute and more on CPU, 128 requests at a time) and
        holds the standard service at NOT_SERVING until it is over, and again from a
        graceful shutdown on. An engine without the standard service is judged by
        HealthCheck alone."""
        proto = self.proto
        reply, serving = await both(
            self._unary(
                "HealthCheck", proto.HealthCheckRequest(), proto.HealthCheckResponse, timeout
            ),
            self._serving(timeout),
        )
        return bool(reply.healthy) and serving()

    async def _serving(self, timeout: float) -> bool:
        request = health_pb2.HealthCheckRequest(service=self.service_name)
        try:
            reply = await self._unary(
                "Check", request, health_pb2.HealthCheckResponse, timeout, HEALTH_SERVICE
            )
        except EngineError as exc:
            if exc.code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND):
                return True
            raise
        return bool(reply.status != health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _model_and_server_info(self, timeout: float) -> tuple[Any, Any]:
        proto = self.proto
        model, server = await both(
            self._unary(
                "GetModelInfo", proto.GetModelInfoRequest(), proto.GetModelInfoResponse, timeout
            ),
            self._unary(
                "GetServerInfo", proto.GetServerInfoRequest(), proto.GetServerInfoResponse, timeout
            ),
        )
        return model, server()

    async def get_loads(self, timeout: float) -> Any:
        """The engine's GetLoadsResponse (one SchedulerLoad per data-parallel rank)."""
        proto = self.proto
        return await self._unary(
            "GetLoads", proto.GetLoadsRequest(), proto.GetLoadsResponse, timeout
        )

    async def load(self, timeout: float) -> EngineLoad:
        reply = await self.get_loads(timeout)
        running = sum(load.num_running_reqs for load in reply.loads)
        waiting = sum(load.num_waiting_reqs for load in reply.loads)
        return EngineLoad(running, waiting)

    def _tokenizer_call(self, timeout: float) -> Any:
        return self.stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=timeout)

    @abc.abstractmethod
    async def info(self, timeout: float) -> EngineInfo: ...

    @abc.abstractmethod
    def build_request(self, request: GenerateRequest) -> Any:
        """The family's GenerateRequest message. Raises EngineError kind bad_request for a
        field the family's proto cannot carry."""

    @abc.abstractmethod
    def build_embed_request(self, request_id: str, token_ids: list[int]) -> Any:
        """The family's EmbedRequest message."""

    def _kv_transfer_params(self, done: Any) -> str | None:
        """What a prefill engine's final message hands to the decode side (vLLM only)."""
        return None

    def _reasoning_tokens(self, done: Any) -> int:
        """The engine's count of reasoning tokens in a final message (SGLang only)."""
        return 0

    def _finished(self, request_id: str, done: Any, generated: int) -> GenerateFinished:
        matched = done.matched_token_id if done.HasField("matched_token_id") else None
        return GenerateFinished(
            request_id=request_id,
            finish_reason=done.finish_reason or "stop",
            prompt_tokens=done.prompt_tokens,
            completion_tokens=generated,
            cached_tokens=done.cached_tokens,
            matched_token_id=matched,
            kv_transfer_params_json=self._kv_transfer_params(done),
            index=done.index,
            reasoning_tokens=self._reasoning_tokens(done),
        )

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateEvent]:
        """Token deltas, then exactly one GenerateFinished per choice (n). Raises EngineError
        (a field the family cannot carry: bad_request, at once); a stream that ends before its
        last final message raises kind `disconnected`.

        Both families send delta token ids in chunks, and a streamed `complete` repeats the
        last chunk's tokens (and logprobs), so its output ids count only when not streaming.
        Completion tokens are counted here: SGLang's counts are cumulative, vLLM's per chunk."""
        built = self._built(request)
        if request.sampling.n == 1 and request.logprobs is None and request.prompt_logprobs is None:
            return self._generate_plain(request, built)
        return self._generate_detailed(request, built)

    def _built(self, request: GenerateRequest) -> Any:
        """The family's request message; EngineError bad_request when it cannot carry it."""
        try:
            return self.build_request(request)
        except EngineError as exc:
            exc.instance_id = self.instance_id
            raise
        except (ValueError, TypeError, OverflowError) as exc:
            # A value the family's proto field cannot hold (top_k >= 2^31 in an int32, ...).
            raise EngineError(
                errors.BAD_REQUEST,
                f"the engine protocol cannot take this request: {exc}",
                self.instance_id,
            ) from exc

    async def stream_into(
        self, request: GenerateRequest, emit: Callable[[Any], None], relay: Relay | None = None
    ) -> None:
        """The events of `generate(request)`, each handed to `emit` as it comes; returns after
        the last final message, raises as `generate` does. On the HTTP/2 streams with one
        choice and no logprobs (the per-token hot path) the replies are converted in the
        connection's read callback: no task wake-up and no generator per token. With `relay`
        as well, a streamed request's plain token chunks go straight into `relay.sink` as
        encoded TokenDeltas (http2.Relay, frames.py), and only the rest comes to `emit`: the
        order of the two is the engine's."""
        if (
            self.streams is None
            or request.sampling.n != 1
            or request.logprobs is not None
            or request.prompt_logprobs is not None
        ):
            async for event in self.generate(request):
                emit(event)
            return
        call = self._call(
            self._built(request), call_metadata(request.http_request_id, request.traceparent)
        )
        if relay is not None and request.stream:
            call.relay_to(relay, request.request_id, self.relay_layout)
        plain = _PlainReplies(request, self._finished)
        convert = plain.convert

        def on_items(call: StreamCall) -> None:
            items = call.items
            plain.generated += call.take_relayed()
            while items:
                if convert(items.popleft(), emit):
                    items.clear()
                    call.stop_reading()  # no reset: the engine ends the stream itself
                    return

        call.feed(on_items)
        try:
            await call.until_done()
        except BaseException:
            call.cancel()
            raise
        if not plain.complete:
            raise EngineError(
                errors.DISCONNECTED, "stream ended without complete", self.instance_id
            )

    def _call(self, built: Any, metadata: tuple[tuple[str, str], ...] | None = None) -> Any:
        """The Generate call: a grpc.aio call, or an http2.StreamCall (both iterate the
        replies and have cancel(); the StreamCall raises EngineErrors itself)."""
        streams = self.streams
        if streams is not None:
            if self.closed:
                raise self._closed()
            return streams.call(
                self._generate_path, built.SerializeToString(), self._decode_reply, metadata
            )
        try:
            return self.stub.Generate(built, metadata=metadata)
        except grpc.aio.UsageError:  # the channel was closed (instance removed)
            raise self._closed() from None

    async def _generate_plain(
        self, request: GenerateRequest, built: Any
    ) -> AsyncIterator[GenerateEvent]:
        """One choice, no logprobs, on a grpc.aio call (stream_into converts the HTTP/2
        streams' replies in their read callback)."""
        call = self._call(built, call_metadata(request.http_request_id, request.traceparent))
        plain = _PlainReplies(request, self._finished)
        events: list[GenerateEvent] = []
        complete = False  # every final message read: the engine ends the stream itself
        try:
            async for reply in call:
                complete = plain.convert(reply, events.append)
                for event in events:
                    yield event
                events.clear()
                if complete:
                    return
        except grpc.aio.AioRpcError as exc:
            raise await self._error(exc) from exc
        except asyncio.CancelledError:
            if _caller_cancelled():
                raise
            # grpc.aio cancels the calls of a channel that is closed under them.
            raise self._closed() from None
        finally:
            if not complete:  # no reset for a finished stream (its trailers are on the way)
                call.cancel()
        raise EngineError(errors.DISCONNECTED, "stream ended without complete", self.instance_id)

    async def _generate_detailed(
        self, request: GenerateRequest, built: Any
    ) -> AsyncIterator[GenerateEvent]:
        """n choices and/or logprobs: deltas carry their choice index and logprobs; prompt
        logprobs ride on the first delta (an empty one if it comes without tokens)."""
        request_id = request.request_id
        choices = request.sampling.n
        want = request.logprobs is not None
        top = request.logprobs or 0
        prompt_top = request.prompt_logprobs or 0
        prompt_pending = request.prompt_logprobs is not None
        generated = [0] * choices
        finished = 0
        complete = False  # every final message read: the engine ends the stream itself
        call = self._call(built, call_metadata(request.http_request_id, request.traceparent))
        try:
            async for reply in call:
                streamed = reply.HasField("chunk")
                if not streamed and not reply.HasField("complete"):
                    continue
                part = reply.chunk if streamed else reply.complete
                index = part.index
                if not 0 <= index < choices:
                    raise EngineError(
                        errors.ENGINE_ERROR,
                        f"the engine sent choice {index} of a request for {choices}",
                        self.instance_id,
                    )
                prompt = None
                if prompt_pending and part.HasField("input_logprobs"):
                    prompt = wire.prompt_logprobs(part.input_logprobs, prompt_top)
                    prompt_pending = False
                ids = part.token_ids if streamed else part.output_ids
                if not streamed and request.stream:
                    ids = ()  # a streamed complete repeats the last chunk
                logprobs = None
                if want and ids:
                    if not part.HasField("output_logprobs"):
                        raise EngineError(
                            errors.ENGINE_ERROR, "the engine sent no logprobs", self.instance_id
                        )
                    logprobs = wire.output_logprobs(part.output_logprobs, len(ids), top)
                if ids or prompt is not None:
                    generated[index] += len(ids)
                    yield TokenDelta(request_id, list(ids), _detail(index, logprobs, prompt))
                if not streamed:
                    if prompt_pending:
                        raise EngineError(
                            errors.ENGINE_ERROR,
                            "the engine sent no prompt logprobs",
                            self.instance_id,
                        )
                    finished += 1
                    complete = finished == choices
                    yield self._finished(request_id, part, generated[index])
                    if complete:
                        return
        except grpc.aio.AioRpcError as exc:
            raise await self._error(exc) from exc
        except asyncio.CancelledError:
            if _caller_cancelled():
                raise
            # grpc.aio cancels the calls of a channel that is closed under them.
            raise self._closed() from None
        finally:
            if not complete:  # no reset for a finished stream (its trailers are on the way)
                call.cancel()
        raise EngineError(errors.DISCONNECTED, "stream ended without complete", self.instance_id)

    async def embed(
        self,
        request_id: str,
        token_ids: list[int],
        timeout: float | None = None,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> Embedding:
        """One input's embedding (the Embed RPC). Raises EngineError."""
        reply = await self._rpc(
            self.stub.Embed, self.build_embed_request(request_id, token_ids), timeout, metadata
        )
        vector = array.array("f", reply.embedding)
        dimensions = reply.embedding_dim or len(vector)
        if dimensions != len(vector):
            raise EngineError(
                errors.ENGINE_ERROR,
                f"the engine sent {len(vector)} values for embedding_dim {dimensions}",
                self.instance_id,
            )
        if sys.byteorder == "big":
            vector.byteswap()
        return Embedding(vector.tobytes(), dimensions, reply.prompt_tokens)

    @abc.abstractmethod
    async def abort(self, request_id: str, timeout: float = 2.0) -> None: ...

    async def fetch_tokenizer(self, timeout: float = 30.0) -> bytes:
        """The engine's tokenizer zip, checked against the sha256 on its last chunk."""
        parts: list[bytes] = []
        digest = ""
        async with self._engine_errors():
            async for chunk in self._tokenizer_call(timeout):
                parts.append(chunk.data)
                if chunk.sha256:
                    digest = chunk.sha256
        data = b"".join(parts)
        if not digest or hashlib.sha256(data).hexdigest() != digest.lower():
            raise EngineError(
                errors.ENGINE_ERROR, "tokenizer zip missing or failing its sha256", self.instance_id
            )
        return data
