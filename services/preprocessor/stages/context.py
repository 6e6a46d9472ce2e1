"""The one object every stage of a request works on: immutable input, shared dependencies,
per-request state (RequestContext = RequestInput + Deps + RequestState).

Stages read `inp` and `deps` and write only `state`; nothing here does I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from switchyard.preprocessor.catalog import ModelEntry
from switchyard.preprocessor.metrics import PreprocessorMetrics
from switchyard.preprocessor.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
)
from switchyard.preprocessor.parsers import ParserChoice
from switchyard.preprocessor.reply_queue import ReplyQueue
from switchyard.preprocessor.stages.timing import StageTimer
from switchyard.preprocessor.stages.watchdog import Shutdown
from switchyard.preprocessor.tokenizer import TokenizerBundle
from switchyard.protos.messages import Instance, SamplingParams

if TYPE_CHECKING:
    from switchyard.preprocessor.dispatcher_client import DispatcherClient
    from switchyard.preprocessor.router_client import RouterClient
    from switchyard.preprocessor.stages.choice import ChoiceOutput
    from switchyard.preprocessor.stages.generation import Generation
    from switchyard.preprocessor.tracing import Trace, Tracing

CHAT = "chat_completions"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"
RESPONSES = "responses"
TOKENIZE = "tokenize"  # answered without an engine (local_endpoints)
DETOKENIZE = "detokenize"
# The router's session key (session affinity); without it, the body's `user` is the key.
SESSION_HEADER = "x-session-id"


@dataclass(frozen=True, slots=True)
class Limits:
    """The request path's timeouts and retry bounds (validated in PreprocessorConfig)."""

    route_timeout: float = 5.0
    first_token_timeout: float = 60.0  # no reply yet on an attempt (prefill may be long)
    gap_timeout: float = 60.0  # between replies once tokens flow
    migration_limit: int = 3
    hop_attempts: int = 2  # the prefill hop: first try + one retry
    busy_seconds: float = 1.0  # how long an overloaded engine is avoided
    offload_chars: int = 2048  # texts this long are tokenized on a worker thread
    # A request the client does not stream is asked of the engine whole (one final message)
    # unless something needs its tokens as they come (see Generation.start); False: always
    # stream from the engine (--engine-streaming always).
    whole_replies: bool = True


@dataclass(frozen=True, slots=True)
class Deps:
    """What every request shares: clients, lookups, metrics. Built once per process."""

    router: RouterClient
    dispatcher: DispatcherClient
    catalog: Callable[[], Mapping[str, ModelEntry]]
    tokenizer: Callable[[str], TokenizerBundle | None]
    instances: Callable[[], Mapping[int, Instance]]
    # The model's output parsers (from --tool-call-parser / --reasoning-parser, else guessed).
    parsers: Callable[[str, TokenizerBundle], ParserChoice]
    metrics: PreprocessorMetrics
    limits: Limits = Limits()
    timer: StageTimer | None = None  # --stage-timing: a benchmark mode
    tracing: Tracing | None = None  # --otlp-endpoint: OpenTelemetry spans per request
    shutdown: Shutdown = field(default_factory=Shutdown)  # every running request's watchdog


@dataclass(frozen=True, slots=True)
class RequestInput:
    endpoint: str  # CHAT | COMPLETIONS | EMBEDDINGS | RESPONSES
    request_id: str  # the client's X-Request-Id or a minted one: the response's `id`
    request: ChatCompletionRequest | CompletionRequest | EmbeddingRequest
    received: float  # time.perf_counter() when the body was read
    created: int  # unix seconds, for the response's `created`
    # The engine request ids' prefix: unique per request even when two clients send the same
    # X-Request-Id ("" : the request id itself, a minted one is unique).
    engine_prefix: str = ""
    session_id: str | None = None  # the x-session-id header, else the body's `user`

    timeout: float = 0.0  # the request's deadline, seconds after `received` (0: none)

    @property
    def engine_id(self) -> str:
        return self.engine_prefix or self.request_id


@dataclass(slots=True)
class RequestState:
    """Filled in stage by stage."""

    entry: ModelEntry | None = None
    tokenizer: TokenizerBundle | None = None
    parsers: ParserChoice | None = None  # the model's output parsers (chat)
    # The prompts: one for chat; a completions batch may have several.
    prompt_texts: list[str | None] = field(default_factory=list)  # None: given as token ids
    prompt_ids: list[list[int]] = field(default_factory=list)
    param: str = "messages"  # the request field the prompt came from (for errors)
    sampling: SamplingParams | None = None
    logprobs: int | None = None  # alternatives per output token asked of the engine
    top_logprobs: int = 0  # alternatives per token the client gets (chat)
    reasoning: bool = False  # the output starts in the model's reasoning
    queue: ReplyQueue = field(default_factory=ReplyQueue)
    choices: list[ChoiceOutput] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)
    # attempt id -> its generation: replies of attempts that ended are ignored.
    attempts: dict[str, Generation] = field(default_factory=dict)
    unfinished: int = 0  # choices still generating
    first_token_at: float | None = None
    migrations: int = 0
    usage: Any = None  # sinks.Usage, once the request finished
    trace: Trace | None = None  # tracing on: the request's spans
    extra: dict[str, Any] = field(default_factory=dict)


class Exchange:
    """One HTTP exchange as the edge sees it: the ids it gave the request, and what `serve`
    reports back for the access log and the metrics."""

    __slots__ = ("path", "request_id", "engine_prefix", "session_id", "ctx", "error", "trace")

    def __init__(self, path: str, request_id: str, engine_prefix: str = "") -> None:
        self.path = path
        self.request_id = request_id
        self.engine_prefix = engine_prefix
        self.session_id: str | None = None  # the x-session-id header
        self.ctx: RequestContext | None = None  # None: the body did not parse
        self.error = ""  # the error code of a failed request (in a stream too)
        self.trace: Trace | None = None  # tracing on: the request's spans


@dataclass(slots=True)
class RequestContext:
    inp: RequestInput
    deps: Deps
    state: RequestState = field(default_factory=RequestState)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def release(self) -> None:
        """The exchange is over (answered, logged): its generations, which point back at
        it, are let go, so reference counting frees the request's objects at once. Left in
        that cycle they lived until a garbage collection, and the collections that walked
        them cost the preprocessor about 5% of its CPU at concurrency 32, with pauses of up
        to 40 ms."""
        self.state.generations = []
