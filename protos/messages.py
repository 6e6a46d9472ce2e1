"""Messages between Switchyard's services, defined once.

Every message is a tagged msgspec Struct, msgpack-encoded on ZMQ. Tags are short because the
per-token messages (`TokenDelta`) are on the hot path. Channels:

    fleet      ROUTER  <- SnapshotRequest, InstanceDownReport      -> Snapshot, Ack
                       <- WorkerAdminRequest                       -> WorkerAdminReply
    fleet      PUB     -> FleetUpdate (ordered by version)
    router     ROUTER  <- RouteRequest, RouteProgress              -> RouteResponse
                       <- FlowAdmit, FlowRelease, FlowSync         -> FlowDecision
                       <- FlowStatusRequest                        -> FlowStatus
    dispatcher ROUTER  <- GenerateRequest, CancelRequest           -> TokenDelta, GenerateFinished,
                                                                      GenerateFailed
                       <- EmbedRequest                             -> Embeddings | GenerateFailed

A generation answers TokenDelta..., then one GenerateFinished per choice (`n` of them, each
with its `index`), or one GenerateFailed that ends every choice. An embed request answers one
Embeddings or one GenerateFailed. CancelRequest stops either.
"""

from __future__ import annotations

from typing import Any

import msgspec

# Instance roles. An engine that reports none is "aggregated" unless the operator lists it as
# prefill (then the others become "decode").
ROLE_AGGREGATED = "aggregated"
ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"

PROTOCOL_SGLANG = "sglang"
PROTOCOL_VLLM = "vllm"


class Instance(msgspec.Struct, frozen=True, kw_only=True):
    """One engine as fleet knows it. Equality of two records means "nothing changed"."""

    instance_id: int  # stable u64 from the normalized URL (switchyard.common.instance_id)
    url: str  # normalized grpc://host:port
    protocol: str  # PROTOCOL_SGLANG | PROTOCOL_VLLM
    model: str  # served model name
    context_length: int  # longest prompt + completion the engine accepts
    block_size: int  # KV block (page) size in tokens
    role: str = ROLE_AGGREGATED
    bootstrap_port: int | None = None  # SGLang disaggregation bootstrap port
    kv_events_endpoint: str | None = None  # the engine's PUB binds here: consumers connect
    kv_replay_endpoint: str | None = None
    # The engine's PUB connects here instead (a named host, by the engine's own rule): the
    # router binds this endpoint for it (rank r at port + r), and tells engines apart by topic.
    kv_events_bind: str | None = None
    kv_topic: str | None = None  # the topic the engine publishes under (None: not reported)
    # Fleet's wall clock when it admitted (or re-admitted) the engine: blocks the engine
    # stored in batches stamped before it (its warm-up) are not indexed. 0: unknown.
    admitted_at: float = 0.0
    max_running_requests: int = 0  # 0 when the engine does not say
    # Data-parallel ranks: each is its own KV cache and scheduler (KV events on base port +
    # rank); a request may be pinned to one with GenerateRequest.data_parallel_rank.
    dp_size: int = 1
    # False when the engine cannot serve a prompt it has to prefill itself (SGLang decode
    # mode, vLLM kv_consumer): the router then never skips the prefill hop for it.
    local_prefill: bool = True
    # GetModelInfo.is_generation: False for an embedding model, which serves Embed only (and
    # answers Generate with INVALID_ARGUMENT); route embed requests only to these.
    is_generation: bool = True


# ---- fleet -------------------------------------------------------------------------------


class InstanceAdded(msgspec.Struct, frozen=True, tag="added"):
    instance: Instance


class InstanceRemoved(msgspec.Struct, frozen=True, tag="removed"):
    instance_id: int
    url: str


class InstanceUpdated(msgspec.Struct, frozen=True, tag="updated"):
    instance: Instance


InstanceEvent = InstanceAdded | InstanceRemoved | InstanceUpdated


class FleetUpdate(msgspec.Struct, frozen=True, tag="fleet_update"):
    """Published on fleet's PUB socket. `version` grows by one per update; a consumer that
    sees a gap asks for a new snapshot."""

    version: int
    events: list[InstanceEvent]


class SnapshotRequest(msgspec.Struct, frozen=True, tag="snapshot_request"):
    pass


class Snapshot(msgspec.Struct, frozen=True, tag="snapshot"):
    """The routable instance set as of `version` (events with version <= this are in it)."""

    version: int
    instances: list[Instance]


class InstanceDownReport(msgspec.Struct, frozen=True, tag="instance_down"):
    """A service saw a fault that means the engine is unreachable (see common.errors)."""

    instance_id: int
    kind: str
    detail: str = ""


class Ack(msgspec.Struct, frozen=True, tag="ack"):
    pass


# The admin API (fleet owns it; the preprocessor serves it over HTTP). Actions: list, add
# (`entry`: a workers-file entry, a URL string with options or a mapping), remove, drain,
# resume (`worker`: an instance id in decimal, or a URL).
ADMIN_ACTIONS = ("list", "add", "remove", "drain", "resume")


class WorkerAdminRequest(msgspec.Struct, frozen=True, kw_only=True, tag="worker_admin"):
    action: str
    worker: str = ""
    entry: str | dict[str, str] | None = None


class WorkerStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One configured worker as the admin API shows it."""

    instance_id: int
    url: str
    source: str  # flag | file | pods | admin
    state: str  # probing | ready | draining | down
    prefill: bool = False  # listed as prefill by the operator
    model_override: str | None = None
    kv_events: str | None = None  # the operator's endpoints (None: the engine's own)
    kv_replay: str | None = None
    error: str = ""  # the last probe failure, while failing
    learned: dict[str, str | int | bool | None] | None = None  # the last good probe's info


class WorkerAdminReply(msgspec.Struct, frozen=True, kw_only=True, tag="worker_admin_reply"):
    status: int  # as HTTP: 200, 201, 400 (bad entry), 404 (unknown worker), 409 (conflict)
    message: str = ""
    workers: list[WorkerStatus] = []


FleetControlRequest = SnapshotRequest | InstanceDownReport | WorkerAdminRequest
FleetControlReply = Snapshot | Ack | WorkerAdminReply

# ---- router ------------------------------------------------------------------------------


class RouteRequest(msgspec.Struct, frozen=True, kw_only=True, tag="route"):
    request_id: str
    model: str
    token_ids: list[int]
    exclude: list[int] = []  # instance ids that already failed this request
    dry_run: bool = False  # decide and explain, but book no load (POST /debug/route)
    session_id: str | None = None  # x-session-id header or the OpenAI `user` field
    # The engine is asked for one final message (the client does not stream) unless a prefill
    # hop is picked: no first token will time its prefill.
    whole: bool = False
    # Request fields only some engine protocols can honour (switchyard.common.capabilities):
    # only engines that can take it (router filter `capable`).
    requires: list[str] = []


class WorkerScore(msgspec.Struct, frozen=True, kw_only=True):
    """How the router saw one candidate (dry runs only)."""

    instance_id: int
    url: str
    overlap_blocks: int
    in_flight: int
    active_blocks: int
    prefill_blocks: int  # blocks this request would prefill there + prefills already queued
    cost: float  # the profile's weighted score turned into a cost: lower is better
    role: str = ""  # the candidate's role; "prefill" rows are the prefill hop's candidates
    dp_rank: int | None = None  # the data-parallel rank (None: the engine has no DP)
    profile: str = ""  # the routing profile that saw it ("decode" / "prefill")
    score: float = 0.0  # weighted sum of the plugins' scores (higher is better)
    scores: dict[str, float] = {}  # plugin name -> its clamped score in [0, 1]
    filtered_by: str = ""  # the filter that removed this worker (then no scores)
    # The time model, in milliseconds: predicted time to first token and its parts.
    ttft_ms: float = 0.0
    prefill_ms: float = 0.0  # computing the uncached prompt tokens there
    queue_ms: float = 0.0  # waiting behind the prefills already queued there
    decode_ms: float = 0.0  # the decode term of the cost: the batch it would join there
    cached_tokens: int = 0  # prompt tokens expected from its cache (offloaded tiers weighed)
    pending_tokens: int = 0  # of those, tokens booked by requests not prefilled yet
    engine_running: int = -1  # the engine's own load report (-1: none yet)
    engine_waiting: int = -1
    engine_kv_usage: float = -1.0
    # How fresh the router's view of this worker's cache is (KV events over ZMQ; -1: not
    # known, e.g. a gRPC-fed worker): see the router's /debug/kv and kv metrics.
    kv_blocks: int = -1  # blocks the index holds for it (device tier)
    kv_event_age_ms: float = -1.0  # since its last KV event (live or replayed)
    kv_last_seq: int = -1
    kv_lag_ms: float = -1.0  # the router's estimate of how far behind the engine it is
    kv_gaps: int = -1
    kv_replays: int = -1
    kv_resets: int = -1
    kv_connected: bool = False
    kv_suspected_stale: bool = False


class RouteResponse(msgspec.Struct, frozen=True, kw_only=True, tag="routed"):
    request_id: str
    instance_id: int | None  # None: no instance can take it (see `error`)
    error: str = ""
    overlap_blocks: int = 0
    prompt_blocks: int = 0
    policy: str = ""
    workers: list[WorkerScore] = []  # filled for dry runs
    # Disaggregation: the prefill worker for the prefill hop; None: no hop (aggregated, or the
    # decode worker prefills locally because little of the prompt is uncached there).
    prefill_instance_id: int | None = None
    # Data-parallel ranks to pin the request to (None: the engine has no DP, or let it pick).
    dp_rank: int | None = None
    prefill_dp_rank: int | None = None
    predicted_ttft_ms: float = 0.0  # the chosen worker's predicted time to first token


# RouteProgress stages: the router frees its load bookkeeping with them.
STAGE_FIRST_TOKEN = "first_token"
STAGE_FINISHED = "finished"


class RouteProgress(msgspec.Struct, frozen=True, tag="progress"):
    """Fire-and-forget notice from the preprocessor; a lost one expires in the router."""

    request_id: str
    instance_id: int
    stage: str


class InstanceBusy(msgspec.Struct, frozen=True, tag="busy"):
    """An engine answered RESOURCE_EXHAUSTED: avoid it for `seconds` unless all are busy."""

    instance_id: int
    seconds: float


class KvDebugRequest(msgspec.Struct, frozen=True, kw_only=True, tag="kv_debug"):
    """GET /debug/kv: one worker's index summary and event stream (`instance_id` None: every
    worker's stream, no index detail)."""

    request_id: str
    instance_id: int | None = None
    dp_rank: int = 0


class KvDebugReply(msgspec.Struct, frozen=True, kw_only=True, tag="kv_debug_reply"):
    request_id: str
    found: bool
    # JSON-ready: {"workers": [...]} or one worker's {"index": ..., "stream": ..., ...}
    body: dict[str, Any] = {}


# ---- flow control (the router's deployment-wide gate; switchyard.common.flow) -------------


class FlowAdmit(msgspec.Struct, frozen=True, kw_only=True, tag="flow_admit"):
    """May this request run? Answered by one FlowDecision, at once or once it leaves the
    gate's queue. Releasing the ticket (FlowRelease) cancels a wait."""

    ticket: str  # the request's engine id: unique per request
    peer: str  # the asking preprocessor (its sync lists what it still runs)
    model: str
    flow: str
    priority: int = 0
    units: int = 1  # sequences the engines will run for it
    cost: int = 1  # tokens: the prompts and the most they may generate
    objective_ms: float = 0.0  # its TTFT objective left when sent (0: none)
    token_ids: list[int] = []  # with an objective: its first prompt, to predict its TTFT
    max_wait_s: float = 0.0  # its own deadline bounds its wait (0: none)
    config: str = ""  # the digest of the sender's flow config (replicas compare)


class FlowDecision(msgspec.Struct, frozen=True, kw_only=True, tag="flow_decision"):
    request_id: str  # the ticket (the router channel matches every reply by request_id)
    admitted: bool
    reason: str = ""  # refused: queue_full | queue_timeout | flow_limit | ttft_objective ...
    message: str = ""
    retry_after_s: float = 0.0
    wait_ms: float = 0.0  # how long it waited in the gate's queue
    predicted_ttft_ms: float = 0.0  # refused by objective: the TTFT it was predicted
    peers: int = 0  # preprocessors the gate hears from (a fallback gate's share)


class FlowRelease(msgspec.Struct, frozen=True, tag="flow_release"):
    """The request ended (or gave up waiting). Fire-and-forget: a lost one is repaired by
    the next FlowSync."""

    ticket: str
    tokens: int = -1  # prompt + generated tokens (-1: unknown), refunded against its cost


class FlowHeld(msgspec.Struct, frozen=True, array_like=True):
    ticket: str
    flow: str
    priority: int
    units: int
    cost: int


class FlowSync(msgspec.Struct, frozen=True, kw_only=True, tag="flow_sync"):
    """Every second, and before the first admit to a router: the requests this preprocessor
    runs (whichever gate admitted them)."""

    peer: str
    held: list[FlowHeld] = []


class FlowStatusRequest(msgspec.Struct, frozen=True, tag="flow_status_request"):
    request_id: str


class FlowStatus(msgspec.Struct, frozen=True, kw_only=True, tag="flow_status"):
    """The gate's state for /debug/flow (None: this router runs no gate)."""

    request_id: str
    state: dict[str, Any] | None = None


RouterRequest = (
    RouteRequest
    | RouteProgress
    | InstanceBusy
    | KvDebugRequest
    | FlowAdmit
    | FlowRelease
    | FlowSync
    | FlowStatusRequest
)
RouterReply = RouteResponse | KvDebugReply | FlowDecision | FlowStatus

# ---- dispatcher --------------------------------------------------------------------------


# Constraint kinds (structured output). The value is the schema / pattern / grammar / tag as the
# client gave it; json_object has none; choice carries `choices`.
CONSTRAINT_JSON_SCHEMA = "json_schema"  # value: a JSON schema (JSON text)
CONSTRAINT_JSON_OBJECT = "json_object"  # any JSON object
CONSTRAINT_REGEX = "regex"  # value: a regular expression the whole output matches
CONSTRAINT_EBNF = "ebnf"  # value: an EBNF grammar (xgrammar's dialect, `root ::= ...`)
CONSTRAINT_STRUCTURAL_TAG = "structural_tag"  # value: an xgrammar structural tag (JSON text)
CONSTRAINT_CHOICE = "choice"  # the output is exactly one of `choices`
CONSTRAINT_KINDS = frozenset(
    {
        CONSTRAINT_JSON_SCHEMA,
        CONSTRAINT_JSON_OBJECT,
        CONSTRAINT_REGEX,
        CONSTRAINT_EBNF,
        CONSTRAINT_STRUCTURAL_TAG,
        CONSTRAINT_CHOICE,
    }
)


class Constraint(msgspec.Struct, frozen=True, kw_only=True):
    """Engine-neutral constrained decoding: one per request. The adapters map each kind to the
    engine's own field (and say which a protocol cannot carry)."""

    kind: str  # one of CONSTRAINT_KINDS
    value: str = ""
    choices: list[str] = []


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """Engine-neutral sampling. Every field is explicit: proto3 would turn a missing value
    into 0, so the adapters always send these."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k
    min_p: float = 0.0
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # vLLM only (SGLang's proto has none: the adapter refuses it)
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    n: int = 1  # samples of the prompt, done by the engine; replies carry their `index`
    logit_bias: dict[int, float] = {}  # token id -> bias added to its logit
    constraint: Constraint | None = None


class DisaggParams(msgspec.Struct, frozen=True, kw_only=True):
    """SGLang DisaggregatedParams: the same values go to the prefill and the decode engine."""

    bootstrap_host: str
    bootstrap_port: int
    bootstrap_room: int


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True, tag="generate"):
    request_id: str
    instance_id: int
    token_ids: list[int]
    sampling: SamplingParams
    disagg: DisaggParams | None = None  # SGLang disaggregation
    kv_transfer_params_json: str | None = None  # vLLM disaggregation (sent unchanged)
    stream: bool = True  # False: the engine answers with one final message (vLLM prefill leg)
    # Output logprobs: None none; k >= 0 the chosen token's logprob plus the k most likely
    # alternatives per token (TokenDelta.logprobs).
    logprobs: int | None = None
    # Prompt logprobs (echo): None none; k >= 0 every prompt token's logprob plus k
    # alternatives, on the request's first TokenDelta (TokenDelta.prompt_logprobs).
    prompt_logprobs: int | None = None
    # The output starts with the model's reasoning (thinking on): SGLang counts reasoning
    # tokens and holds a constraint back until the reasoning ends (require_reasoning); vLLM
    # holds it back by itself when it runs a reasoning parser, and with this false the adapter
    # tells it to constrain from the first token (grammar_from_first_token).
    reasoning: bool = False
    data_parallel_rank: int | None = None  # pin to this DP rank (None: the engine balances)
    # Sent to the engine as gRPC metadata (x-request-id, traceparent) so its logs and traces
    # join the client's request: the HTTP request id, and the W3C trace context of the
    # preprocessor's dispatch span (None when tracing is off).
    http_request_id: str | None = None
    traceparent: str | None = None


class EmbedRequest(msgspec.Struct, frozen=True, kw_only=True, tag="embed"):
    """Embed each input (token ids) on one embedding instance; one Embeddings reply."""

    request_id: str
    instance_id: int
    inputs: list[list[int]]
    http_request_id: str | None = None  # as on GenerateRequest
    traceparent: str | None = None


class CancelRequest(msgspec.Struct, frozen=True, tag="cancel"):
    request_id: str


class TokenLogprobs(msgspec.Struct, frozen=True, array_like=True):
    """Logprobs of a delta's tokens, one entry per token. `top_ids` / `top_logprobs` hold, per
    token, the alternatives in the engine's order (SGLang: most likely first; vLLM: the chosen
    token first, then the most likely others); empty lists when no alternatives were asked."""

    logprobs: list[float]
    top_ids: list[list[int]] = []
    top_logprobs: list[list[float]] = []


class PromptLogprobs(msgspec.Struct, frozen=True, array_like=True):
    """Logprobs of the prompt's tokens, one entry per prompt token; the first is None (nothing
    precedes it) and its alternatives are empty."""

    logprobs: list[float | None]
    top_ids: list[list[int]] = []
    top_logprobs: list[list[float]] = []


class DeltaDetail(msgspec.Struct, frozen=True, array_like=True):
    """What a TokenDelta carries beyond its tokens, when it carries anything."""

    index: int = 0  # the choice (0 ..< n)
    logprobs: TokenLogprobs | None = None  # as many entries as the delta's token_ids
    prompt_logprobs: PromptLogprobs | None = None  # on the request's first delta only


class TokenDelta(msgspec.Struct, frozen=True, array_like=True, tag="d"):
    """New output tokens of a request. Replies are array-encoded: TokenDelta is per-token, so
    its extras sit behind one optional field (`detail`, None for choice 0 without logprobs)
    that costs the common case one byte (bench/token_delta.py). A delta that carries only
    prompt logprobs may have no token_ids."""

    request_id: str
    token_ids: list[int]
    detail: DeltaDetail | None = None

    @property
    def index(self) -> int:
        return self.detail.index if self.detail is not None else 0

    @property
    def logprobs(self) -> TokenLogprobs | None:
        return self.detail.logprobs if self.detail is not None else None

    @property
    def prompt_logprobs(self) -> PromptLogprobs | None:
        return self.detail.prompt_logprobs if self.detail is not None else None


class GenerateFinished(msgspec.Struct, frozen=True, kw_only=True, array_like=True, tag="f"):
    request_id: str
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    matched_token_id: int | None = None
    kv_transfer_params_json: str | None = None  # vLLM prefill leg: the decode leg's params
    index: int = 0  # the choice this ends; a request with n choices ends after n of these
    reasoning_tokens: int = 0  # the engine's count (SGLang with `reasoning`), else 0


class Embeddings(msgspec.Struct, frozen=True, kw_only=True, array_like=True, tag="e"):
    """One vector per input, in order, each as little-endian float32 bytes (what the engines'
    proto floats are, and exactly OpenAI's base64 `encoding_format` once base64-encoded;
    `array.array("f", v).tolist()` gives floats on a little-endian host)."""

    request_id: str
    dimensions: int
    vectors: list[bytes]
    prompt_tokens: int  # over every input


class GenerateFailed(msgspec.Struct, frozen=True, kw_only=True, array_like=True, tag="x"):
    """The engine or the transport failed the request; `kind` is a common.errors kind."""

    request_id: str
    instance_id: int
    kind: str
    message: str
    # False when the path to the engine failed (a dispatcher died), not the engine: the
    # request migrates without excluding the instance.
    engine_fault: bool = True


DispatcherRequest = GenerateRequest | CancelRequest | EmbedRequest
DispatcherReply = TokenDelta | GenerateFinished | GenerateFailed | Embeddings
