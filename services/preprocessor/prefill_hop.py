"""The prefill hop of disaggregated serving: one request, two engines.

`open_hop` starts the hop and returns a `HopStream`; the decode leg's replies (token deltas,
then one GenerateFinished or GenerateFailed) go straight into the request's reply queue, as a
plain dispatch's do, and so do the hop's own failures.

- SGLang: a random `bootstrap_room`, `bootstrap_host` = the prefill engine's host and
  `bootstrap_port` = its bootstrap port; the same DisaggregatedParams go to the prefill and the
  decode engine at once. The decode leg streams to the caller; the prefill leg (which answers
  once the decode engine took the KV) is drained in the background.
- vLLM: sequential. The prefill leg (max_tokens 1, no streaming, do_remote_decode) must finish
  with kv_transfer_params_json; the decode leg carries that JSON unchanged.

A failure of the hop before the decode leg's first token (a prefill leg failing or silent, a
decode leg whose KV transfer failed: see `HopStream.blame`) is reported as a migratable
GenerateFailed naming the prefill instance, so the generation re-routes without it; other
decode-leg failures pass as they are. Every wait is bounded by the idle timeout. Whatever goes
wrong inside the hop's own tasks, the generation gets a final reply: an expected failure (no
dispatcher) fails the hop as migratable; an unforeseen exception becomes one GenerateFailed of
kind `engine_error` (logged with its traceback, counted through `on_internal_error`), never a
hop that stays silent until the idle timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import msgspec

from switchyard.common import errors
from switchyard.preprocessor.dispatcher_client import GenerationStream
from switchyard.preprocessor.reply_queue import ReplyQueue
from switchyard.protos.messages import (
    PROTOCOL_SGLANG,
    PROTOCOL_VLLM,
    DisaggParams,
    GenerateFailed,
    GenerateFinished,
    GenerateRequest,
    Instance,
    TokenDelta,
)

log = logging.getLogger(__name__)

# vLLM's prefill-side request params (as in vLLM's disaggregated proxy examples).
VLLM_PREFILL_PARAMS = json.dumps(
    {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
)
PREFILL_SUFFIX = ".p"
_ROOM_MAX = 2**31 - 1  # the proto's bootstrap_room is an int32

# Opens a dispatcher stream: into the given queue, or into one of its own (None).
Opener = Callable[[GenerateRequest, ReplyQueue | None], Awaitable[GenerationStream]]

# Background prefill drains keep a reference here until they end.
_background: set[asyncio.Task[None]] = set()


def supported(prefill: Instance, decode: Instance) -> bool:
    """Whether the pipeline can run a hop between these two instances."""
    if prefill.protocol != decode.protocol:
        return False
    if prefill.protocol == PROTOCOL_SGLANG:
        return prefill.bootstrap_port is not None
    return prefill.protocol == PROTOCOL_VLLM


def mint_room() -> int:
    return secrets.randbelow(_ROOM_MAX) + 1


def bootstrap_host(url: str) -> str:
    return urlsplit(url).hostname or "127.0.0.1"


def _transfer_failure(reply: GenerateFailed) -> bool:
    """A decode leg that failed because its KV did not arrive (SGLang INTERNAL "Decode transfer
    failed", vLLM FAILED_PRECONDITION "KV transfer failed"), or a leg that cannot be reached."""
    return reply.kind in errors.MIGRATABLE or "transfer failed" in reply.message.lower()


class HopStream:
    """The hop of one attempt: `queue` is the request's reply queue; `cancel` stops both legs.

    The generation sets `started` once the decode leg produced a token: from then on the
    prefill side can no longer fail the request."""

    def __init__(
        self,
        request: GenerateRequest,
        prefill: Instance,
        idle_timeout: float,
        queue: ReplyQueue,
        on_internal_error: Callable[[str], None] | None = None,
    ) -> None:
        self.request = request
        self.prefill = prefill
        self.idle_timeout = idle_timeout
        self.queue = queue
        self.on_internal_error = on_internal_error
        self.started = False
        self.done = False  # the hop reported its own final message
        self._legs: list[GenerationStream] = []
        self._tasks: list[asyncio.Task[None]] = []

    def blame(self, reply: GenerateFailed) -> GenerateFailed:
        """A decode-leg failure before its first token that means the KV never arrived counts
        against the prefill instance (and migrates); any other passes as it is."""
        if self.started or reply.instance_id == self.prefill.instance_id:
            return reply
        if not _transfer_failure(reply):
            return reply
        return self._failure(reply.kind, f"decode leg: {reply.message}")

    def _failure(self, kind: str, message: str) -> GenerateFailed:
        log.warning(
            "prefill hop failed request_id=%s prefill_instance_id=%d: %s",
            self.request.request_id,
            self.prefill.instance_id,
            message,
            extra={"request_id": self.request.request_id},
        )
        if kind not in errors.MIGRATABLE:
            kind = errors.DISCONNECTED
        return GenerateFailed(
            request_id=self.request.request_id,
            instance_id=self.prefill.instance_id,
            kind=kind,
            message=f"prefill hop via instance {self.prefill.instance_id}: {message}",
        )

    def _fail(self, kind: str, message: str) -> None:
        """The hop failed before the decode leg's first token: blame the prefill instance."""
        if self.done or self.started:
            return
        self.done = True
        self.queue.put_nowait(self._failure(kind, message))

    async def _next(self, leg: GenerationStream) -> Any:
        try:
            async with asyncio.timeout(self.idle_timeout):
                return await leg.queue.get()
        except TimeoutError:
            return None

    def _spawn(self, coro: Any) -> None:
        self._tasks.append(asyncio.create_task(self._guarded(coro)))

    async def _guarded(self, coro: Any) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except errors.SwitchyardError as exc:  # e.g. no dispatcher: fail the hop, never hang
            self._fail(errors.DISCONNECTED, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            self._internal_error(exc)

    def _internal_error(self, exc: Exception) -> None:
        """A bug, not a fault of the engines: fail the request (not migratable), once."""
        log.error(
            "prefill hop failed unexpectedly request_id=%s prefill_instance_id=%d",
            self.request.request_id,
            self.prefill.instance_id,
            exc_info=exc,
            extra={"request_id": self.request.request_id},
        )
        if self.on_internal_error is not None:
            self.on_internal_error("prefill_hop")
        if not self.done:
            self.done = True
            self.queue.put_nowait(
                GenerateFailed(
                    request_id=self.request.request_id,
                    instance_id=self.prefill.instance_id,
                    kind=errors.ENGINE_ERROR,
                    message=f"internal error in the prefill hop: {type(exc).__name__}: {exc}",
                )
            )

    async def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        for leg in self._legs:
            await leg.cancel()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for leg in self._legs:
            leg.close()


class _SglangHop(HopStream):
    async def start(self, open_stream: Opener, decode: Instance) -> None:
        params = DisaggParams(
            bootstrap_host=bootstrap_host(self.prefill.url),
            bootstrap_port=int(self.prefill.bootstrap_port or 0),
            bootstrap_room=mint_room(),
        )
        base = self.request
        prefill_req = msgspec.structs.replace(
            base,
            request_id=base.request_id + PREFILL_SUFFIX,
            instance_id=self.prefill.instance_id,
            disagg=params,
            data_parallel_rank=None,  # the decode engine's rank: the prefill engine picks its own
        )
        decode_req = msgspec.structs.replace(base, instance_id=decode.instance_id, disagg=params)
        prefill_leg = await open_stream(prefill_req, None)
        try:
            decode_leg = await open_stream(decode_req, self.queue)
        except BaseException:
            await prefill_leg.cancel()
            raise
        self._legs = [decode_leg, prefill_leg]
        drain = asyncio.create_task(self._guarded(self._drain(prefill_leg, decode_leg)))
        _background.add(drain)
        drain.add_done_callback(_background.discard)

    async def _drain(self, leg: GenerationStream, decode_leg: GenerationStream) -> None:
        """Read the prefill leg to its end; its failure before the decode's first token fails
        the hop (and cancels the decode leg, which would wait for KV that never comes)."""
        try:
            while True:
                reply = await self._next(leg)
                if reply is None:
                    await leg.cancel()
                    if not self.started:
                        self._fail(errors.TIMEOUT, f"prefill leg silent for {self.idle_timeout:g}s")
                        await decode_leg.cancel()
                    return
                if type(reply) is TokenDelta:
                    continue
                leg.close()
                if type(reply) is GenerateFailed and not self.started:
                    self._fail(reply.kind, f"prefill leg: {reply.message}")
                    await decode_leg.cancel()
                return
        except asyncio.CancelledError:
            await leg.cancel()
            raise


class _VllmHop(HopStream):
    async def start(self, open_stream: Opener, decode: Instance) -> None:
        self._spawn(self._run(open_stream, decode))

    async def _run(self, open_stream: Opener, decode: Instance) -> None:
        base = self.request
        prefill_req = msgspec.structs.replace(
            base,
            request_id=base.request_id + PREFILL_SUFFIX,
            instance_id=self.prefill.instance_id,
            sampling=msgspec.structs.replace(base.sampling, max_tokens=1, min_tokens=0),
            stream=False,
            kv_transfer_params_json=VLLM_PREFILL_PARAMS,
            data_parallel_rank=None,  # the decode engine's rank: the prefill engine picks its own
        )
        leg = await open_stream(prefill_req, None)
        self._legs = [leg]
        params: str | None = None
        deltas: list[TokenDelta] = []
        while True:
            reply = await self._next(leg)
            if reply is None:
                await leg.cancel()
                self._fail(errors.TIMEOUT, f"prefill leg silent for {self.idle_timeout:g}s")
                return
            if type(reply) is TokenDelta:
                deltas.append(reply)
                continue
            leg.close()
            if type(reply) is GenerateFailed:
                self._fail(reply.kind, f"prefill leg: {reply.message}")
                return
            assert type(reply) is GenerateFinished
            params = reply.kv_transfer_params_json
            break
        if not params:
            if reply.finish_reason == "stop":
                # The first token ended the request (EOS / stop token): no KV is handed over
                # (vLLM hands over length-capped prefills only) and the answer is complete.
                self.done = True
                for delta in deltas:
                    self.queue.put_nowait(
                        msgspec.structs.replace(delta, request_id=base.request_id)
                    )
                self.queue.put_nowait(msgspec.structs.replace(reply, request_id=base.request_id))
                return
            self._fail(errors.DISCONNECTED, "prefill leg ended without kv_transfer_params")
            return
        decode_req = msgspec.structs.replace(
            base, instance_id=decode.instance_id, kv_transfer_params_json=params
        )
        self._legs = [await open_stream(decode_req, self.queue)]


async def open_hop(
    open_stream: Opener,
    request: GenerateRequest,
    prefill: Instance,
    decode: Instance,
    idle_timeout: float,
    queue: ReplyQueue,
    on_internal_error: Callable[[str], None] | None = None,
) -> HopStream:
    """Start the hop for `request` (addressed to the decode instance); replies go to `queue`."""
    hop: _SglangHop | _VllmHop
    if prefill.protocol == PROTOCOL_SGLANG:
        hop = _SglangHop(request, prefill, idle_timeout, queue, on_internal_error)
    else:
        hop = _VllmHop(request, prefill, idle_timeout, queue, on_internal_error)
    await hop.start(open_stream, decode)
    return hop
