"""The contracts of the request path: what a request is, what every request shares, and what
the stages write to and read from.

A request is one `RequestContext`: what the stages derive and decide, the parsed body first
(the prompt, sampling, choices, generations, the answer's sink), beside `inp` (RequestInput,
frozen: what arrived before its body was read: endpoint, ids, clock, deadline, where the answer
goes) and `deps` (Deps: the process's clients and lookups, shared). Its engine requests are
`Generation`s (generation.py), each over its attempts. The edge builds it, `endpoints.serve`
runs the endpoint's stages on it, the access log reads it afterwards. `HttpOut` is the
answer's channel, `Sink` what the token loop writes a request's output to. Nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

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
    from switchyard.preprocessor.errors import RequestError
    from switchyard.preprocessor.flow_client import FlowClient
    from switchyard.preprocessor.parsers import ParsedDelta
    from switchyard.preprocessor.router_client import RouterClient
    from switchyard.preprocessor.stages.choice import ChoiceOutput
    from switchyard.preprocessor.stages.generation import Attempt, Generation
    from switchyard.preprocessor.stages.sinks import Usage
    from switchyard.preprocessor.storage.service import Storage
    from switchyard.preprocessor.tracing import Trace, Tracing

CHAT = "chat_completions"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"
RESPONSES = "responses"
MESSAGES = "messages"  # the Anthropic Messages API
TOKENIZE = "tokenize"  # answered without an engine (local_endpoints)
DETOKENIZE = "detokenize"
COUNT_TOKENS = "count_tokens"  # /v1/messages/count_tokens
ANTHROPIC = frozenset({MESSAGES, COUNT_TOKENS})  # errors in Anthropic's shape
# The router's session key (session affinity); without it, the body's `user` is the key.
SESSION_HEADER = "x-session-id"

Body: TypeAlias = ChatCompletionRequest | CompletionRequest | EmbeddingRequest


class HttpOut(Protocol):
    """The response side of one HTTP exchange (edge.py implements it over ASGI)."""

    async def start_stream(self) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def end_stream(self, data: bytes = b"") -> None: ...

    async def respond(
        self, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None: ...


class Sink(Protocol):
    """What the token loop writes a request's output to (a stream or one body at the end);
    each endpoint's sinks implement it: sinks.py's for chat and completions, responses.py's
    for the Responses API."""

    started: bool  # the status line went out: a failure now goes inside the answer

    def content(self, choice: ChoiceOutput, text: str) -> None: ...

    def echo(self, choice: ChoiceOutput) -> None: ...

    def parsed(self, choice: ChoiceOutput, parsed: ParsedDelta) -> None: ...

    def logprobs(self, choice: ChoiceOutput, part: Any) -> None: ...

    def finish(self, choice: ChoiceOutput) -> None: ...

    async def flush(self) -> None: ...

    async def end(self, choices: list[ChoiceOutput], usage: Usage) -> None: ...

    async def fail(self, err: RequestError) -> bool: ...


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
    # unless something needs its tokens as they come (see generation.whole_unless_hop);
    # False: always stream from the engine (--engine-streaming always).
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
    storage: Storage | None = None  # stored responses and conversations (None: --store none)
    flow: FlowClient | None = None  # --flow-config: the deployment's flow gate (stages/admit)


@dataclass(frozen=True, slots=True)
class RequestInput:
    """What arrived, known before the body is read."""

    endpoint: str  # CHAT | COMPLETIONS | EMBEDDINGS | RESPONSES
    request_id: str  # the client's X-Request-Id or a minted one: the response's `id`
    http: HttpOut  # where the answer goes
    received: float  # time.perf_counter() when the request came in
    path: str = ""  # the HTTP path (the access log's route)
    # The engine request ids' prefix: unique per request even when two clients send the same
    # X-Request-Id ("" : the request id itself, a minted one is unique).
    engine_prefix: str = ""
    session_id: str | None = None  # the x-session-id header
    timeout: float = 0.0  # the request's deadline, seconds after `received` (0: none)
    headers: Sequence[tuple[bytes, bytes]] = ()  # as ASGI gave them (flow control reads some)
    created: int = field(default_factory=lambda: int(time.time()))  # the answer's `created`
    tenant: str = ""  # whose stored objects it may read and keep (auth.tenant_of)

    @property
    def engine_id(self) -> str:
        return self.engine_prefix or self.request_id


@dataclass(slots=True)
class RequestContext:
    """One request in flight: what the stages derive and decide, stage by stage (the parsed
    body first), beside what arrived (`inp`) and what every request shares (`deps`)."""

    inp: RequestInput
    deps: Deps
    raw: bytes = b""  # the body as read (the `parse` stage consumes it)
    body: Body | None = None  # the parsed body (the `parse` stage; read it as `request`)
    session_id: str | None = None  # the router's session key: the header, else `user`
    entry: ModelEntry | None = None
    tokenizer: TokenizerBundle | None = None
    parsers: ParserChoice | None = None  # the model's output parsers (chat)
    # The prompts: one for chat; a completions batch may have several.
    prompt_texts: list[str | None] = field(default_factory=list)  # None: given as token ids
    prompt_ids: list[list[int]] = field(default_factory=list)
    param: str = "messages"  # the request field the prompt came from (for errors)
    sampling: SamplingParams | None = None
    # Fields only some engines can honour (`seed`): routed to those (RouteRequest.requires).
    requires: tuple[str, ...] = ()
    logprobs: int | None = None  # alternatives per output token asked of the engine
    top_logprobs: int = 0  # alternatives per token the client gets (chat)
    reasoning: bool = False  # the output starts in the model's reasoning
    queue: ReplyQueue = field(default_factory=ReplyQueue)
    sink: Sink | None = None  # where the output goes (the `generate` stage makes it)
    choices: list[ChoiceOutput] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)
    # engine request id -> its attempt: replies of attempts that ended are ignored.
    attempts: dict[str, Attempt] = field(default_factory=dict)
    unfinished: int = 0  # choices still generating
    restarts: int = 0  # times the whole request started over from its prompt
    first_token_at: float | None = None
    migrations: int = 0
    active: bool = False  # counted in the active-requests gauge
    usage: Usage | None = None  # once the request finished
    error: str = ""  # the error code of a failed request (in a stream too)
    trace: Trace | None = None  # tracing on: the request's spans
    extra: dict[str, Any] = field(default_factory=dict)
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # added to the answer's
    flow_ticket: str | None = None  # admitted by the flow gate: released when it ends

    @property
    def request(self) -> Body:
        """The parsed body (every stage after `parse` may read it)."""
        request = self.body
        if request is None:
            raise RuntimeError("the request body is read by the parse stage, first")
        return request

    def release(self) -> None:
        """The exchange is over (answered, logged): its generations, which point back at
        it, are let go, so reference counting frees the request's objects at once (left in
        that cycle they would wait for a garbage collection, which walks them all)."""
        for gen in self.generations:
            gen.attempt = None  # (an attempt points back at its generation)
        self.generations = []
        self.attempts = {}
