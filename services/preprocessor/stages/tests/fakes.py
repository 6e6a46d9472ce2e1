"""Stand-ins for the router and dispatcher clients and the HTTP side, for stage tests.

The dispatcher is scripted: `script(request)` returns the replies an attempt gets (queued at
once), or None to leave the attempt silent. Everything else is real: the DeepSeek tokenizer,
the chat template, the stages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from switchyard.preprocessor.catalog import ModelEntry
from switchyard.preprocessor.metrics import PreprocessorMetrics
from switchyard.preprocessor.parsers import parsers_for
from switchyard.preprocessor.reply_queue import ReplyQueue
from switchyard.preprocessor.stages import endpoints
from switchyard.preprocessor.stages.context import Deps, Limits
from switchyard.preprocessor.tokenizer import TokenizerBundle
from switchyard.protos.messages import (
    GenerateFailed,
    GenerateFinished,
    GenerateRequest,
    Instance,
    RouteRequest,
    RouteResponse,
    TokenDelta,
)

MODEL = "m"


class FakeRouter:
    """Routes to the first instance not excluded; `dp_ranks` pins instances' requests to a
    data-parallel rank; `prefill`: an SGLang prefill instance every request hops through."""

    def __init__(
        self,
        instances: list[int],
        dp_ranks: dict[int, int] | None = None,
        policy: str = "",
        overlap_blocks: int = 0,
        prefill: int | None = None,
    ) -> None:
        self.instances = instances
        self.prefill = prefill
        self.dp_ranks = dp_ranks or {}
        self.requests: list[RouteRequest] = []
        self.policy = policy  # "kv": replies predict `overlap_blocks` cached blocks
        self.overlap_blocks = overlap_blocks
        self.excluded: list[list[int]] = []
        self.progress_log: list[tuple[str, str]] = []
        self.busy_log: list[int] = []

    async def route(self, request, timeout):
        self.requests.append(request)
        self.excluded.append(list(request.exclude))
        free = [i for i in self.instances if i not in request.exclude]
        return RouteResponse(
            request_id=request.request_id,
            instance_id=free[0] if free else None,
            error="" if free else "no_worker",
            dp_rank=self.dp_ranks.get(free[0]) if free else None,
            policy=self.policy,
            overlap_blocks=self.overlap_blocks,
            prefill_instance_id=self.prefill if free else None,
        )

    async def progress(self, request_id, instance_id, stage, final) -> None:
        self.progress_log.append((request_id, stage))

    async def busy(self, instance_id, seconds) -> None:
        self.busy_log.append(instance_id)


class FakeStream:
    def __init__(self, request: GenerateRequest, queue: ReplyQueue) -> None:
        self.request = request
        self.queue = queue
        self.cancelled = False
        self.closed = False

    async def cancel(self) -> None:
        self.cancelled = True

    def close(self) -> None:
        self.closed = True


Script = Callable[[GenerateRequest], list[Any] | None]


class FakeDispatcher:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[GenerateRequest] = []
        self.streams: list[FakeStream] = []

    async def open(self, request: GenerateRequest, queue: ReplyQueue | None = None):
        self.requests.append(request)
        stream = FakeStream(request, queue if queue is not None else ReplyQueue())
        self.streams.append(stream)
        for reply in self.script(request) or ():
            stream.queue.put_nowait(reply)
        return stream

    async def wait_connected(self, timeout: float) -> bool:
        return True


class FakeHttp:
    """Records what the stages send: the status, each write, the end."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.writes: list[bytes] = []
        self.ended = False
        self.last = b""  # what the end of the stream carried

    async def start_stream(self) -> None:
        self.status = 200

    async def write(self, data: bytes) -> None:
        assert not self.ended, "a write after the end of the stream"
        self.writes.append(data)

    async def end_stream(self, data: bytes = b"") -> None:
        if data:
            self.writes.append(data)
        self.last = data
        self.ended = True

    async def respond(self, status: int, body: bytes, extra=None) -> None:
        self.status = status
        self.headers = dict(extra or [])
        self.writes.append(body)
        self.ended = True

    @property
    def body(self) -> bytes:
        return b"".join(self.writes)

    def json(self) -> Any:
        return orjson.loads(self.body)

    def events(self) -> list[Any]:
        """The SSE data payloads, parsed ([DONE] as the string)."""
        out = []
        for frame in self.body.split(b"\n\n"):
            if frame.startswith(b"data: "):
                data = frame[6:]
                out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
        return out


def deps(
    bundle: TokenizerBundle,
    router: FakeRouter,
    dispatcher: FakeDispatcher,
    context_length: int = 4096,
    tracing: Any = None,
    **limits: Any,
) -> Deps:
    entry = ModelEntry(MODEL, context_length, 1)
    instances = {
        i: Instance(
            instance_id=i,
            url=f"grpc://10.0.0.{i}:1",
            protocol="sglang",
            model=MODEL,
            context_length=context_length,
            block_size=16,
        )
        for i in router.instances
    }
    if router.prefill is not None:
        instances[router.prefill] = Instance(
            instance_id=router.prefill,
            url=f"grpc://10.0.0.{router.prefill}:1",
            protocol="sglang",
            model=MODEL,
            context_length=context_length,
            block_size=16,
            role="prefill",
            bootstrap_port=8998,
        )
    return Deps(
        router=router,  # type: ignore[arg-type]
        dispatcher=dispatcher,  # type: ignore[arg-type]
        catalog=lambda: {MODEL: entry},
        tokenizer=lambda model: bundle if model == MODEL else None,
        instances=lambda: instances,
        parsers=lambda model, b: parsers_for(b.model_config, b.chat_template.source),
        metrics=PreprocessorMetrics(),
        limits=Limits(**limits),
        tracing=tracing,
    )


def done(
    rid: str, reason: str = "length", cached: int = 0, matched: int | None = None
) -> GenerateFinished:
    return GenerateFinished(
        request_id=rid,
        finish_reason=reason,
        prompt_tokens=0,
        completion_tokens=0,
        cached_tokens=cached,
        matched_token_id=matched,
    )


def failed(rid: str, instance: int, kind: str, engine_fault: bool = True) -> GenerateFailed:
    return GenerateFailed(
        request_id=rid, instance_id=instance, kind=kind, message="boom", engine_fault=engine_fault
    )


def tokens(rid: str, *ids: int) -> TokenDelta:
    return TokenDelta(rid, list(ids))


def chat_body(**fields: Any) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    body.update(fields)
    return orjson.dumps(body)


async def serve(
    d: Deps, endpoint: str, body: bytes, http: FakeHttp, session_id: str | None = None
) -> int:
    """endpoints.serve for a request received now, with a minted id."""
    ctx = endpoints.new_request(d, endpoint, http, session_id=session_id)
    return await endpoints.serve(ctx, body)
