"""The prefill hop of disaggregated serving: one request, two engines.

`open_hop` returns a `HopStream` that the pipeline reads like a dispatcher stream (token
deltas, then one GenerateFinished or GenerateFailed), carrying only the decode leg's output.

- SGLang: a random `bootstrap_room`, `bootstrap_host` = the prefill engine's host and
  `bootstrap_port` = its bootstrap port; the same DisaggregatedParams go to the prefill and the
  decode engine at once. The decode leg streams to the caller; the prefill leg (which answers
  once the decode engine took the KV) is drained in the background.
- vLLM: sequential. The prefill leg (max_tokens 1, no streaming, do_remote_decode) must finish
  with kv_transfer_params_json; the decode leg carries that JSON unchanged.

A failure of the hop before the decode leg's first token (a prefill leg failing, a decode leg
whose KV transfer failed, a silent leg) is reported as a migratable GenerateFailed naming the
prefill instance, so the pipeline re-routes without it; other decode-leg failures pass as they
are. Every wait is bounded by the pipeline's idle timeout.
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

Opener = Callable[[GenerateRequest], Awaitable[GenerationStream]]

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
    """The decode leg's replies in `queue`; `cancel` stops both legs."""

    def __init__(self, request: GenerateRequest, prefill: Instance, idle_timeout: float) -> None:
        self.request = request
        self.prefill = prefill
        self.idle_timeout = idle_timeout
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.started = False  # the decode leg produced a token
        self.done = False  # a final message is in the queue
        self._legs: list[GenerationStream] = []
        self._tasks: list[asyncio.Task[None]] = []

    def _fail(self, kind: str, message: str) -> None:
        """The hop failed before the decode leg's first token: blame the prefill instance."""
        if self.done:
            return
        self.done = True
        log.warning(
            "prefill hop failed request_id=%s prefill_instance_id=%d: %s",
            self.request.request_id,
            self.prefill.instance_id,
            message,
        )
        if kind not in errors.MIGRATABLE:
            kind = errors.DISCONNECTED
        self.queue.put_nowait(
            GenerateFailed(
                request_id=self.request.request_id,
                instance_id=self.prefill.instance_id,
                kind=kind,
                message=f"prefill hop via instance {self.prefill.instance_id}: {message}",
            )
        )

    async def _forward(self, leg: GenerationStream) -> None:
        """Copy the decode leg to `queue`, rewriting a failed KV transfer into a hop failure."""
        while True:
            reply = await leg.queue.get()
            if type(reply) is TokenDelta:
                self.started = True
                self.queue.put_nowait(reply)
                continue
            if type(reply) is GenerateFailed and not self.started and _transfer_failure(reply):
                self._fail(reply.kind, f"decode leg: {reply.message}")
            elif not self.done:
                self.done = True
                self.queue.put_nowait(reply)
            return

    async def _next(self, leg: GenerationStream) -> Any:
        try:
            async with asyncio.timeout(self.idle_timeout):
                return await leg.queue.get()
        except TimeoutError:
            return None

    def _spawn(self, coro: Any) -> None:
        self._tasks.append(asyncio.create_task(coro))

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
        prefill_leg = await open_stream(prefill_req)
        try:
            decode_leg = await open_stream(decode_req)
        except BaseException:
            await prefill_leg.cancel()
            raise
        self._legs = [decode_leg, prefill_leg]
        self._spawn(self._forward(decode_leg))
        drain = asyncio.create_task(self._drain(prefill_leg, decode_leg))
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
        try:
            await self._legs_in_turn(open_stream, decode)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # e.g. no dispatcher: fail the hop, never hang
            self._fail(errors.DISCONNECTED, f"{type(exc).__name__}: {exc}")

    async def _legs_in_turn(self, open_stream: Opener, decode: Instance) -> None:
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
        leg = await open_stream(prefill_req)
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
                self.started = self.done = True
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
        decode_leg = await open_stream(decode_req)
        self._legs = [decode_leg]
        await self._forward(decode_leg)


async def open_hop(
    open_stream: Opener,
    request: GenerateRequest,
    prefill: Instance,
    decode: Instance,
    idle_timeout: float,
) -> HopStream:
    """Start the hop for `request` (addressed to the decode instance)."""
    hop: _SglangHop | _VllmHop
    if prefill.protocol == PROTOCOL_SGLANG:
        hop = _SglangHop(request, prefill, idle_timeout)
    else:
        hop = _VllmHop(request, prefill, idle_timeout)
    await hop.start(open_stream, decode)
    return hop
