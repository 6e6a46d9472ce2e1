"""Protocol-neutral request and event types shared by the core and the protocol adapters."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max new tokens or the context length reached
    ABORT = "abort"  # Abort RPC


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingSpec:
    max_new_tokens: int | None = None  # None: until EOS or the context limit
    min_new_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int | None = None  # temperature > 0 without a seed: a per-request random salt
    logit_bias: Mapping[int, float] = dataclasses.field(default_factory=dict)
    logprobs: int | None = None  # None: no logprobs; k: the emitted token's and the top k


class OutputPlan(Protocol):
    """Output a request must produce (constrained or scripted): its token ids, given a seed
    that differs per sample (the context and the sample's salt)."""

    def tokens(self, seed: int) -> Sequence[int]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingSpec
    # prompt tokens whose KV a prefill engine handed over: no prefill cost, reported as cached
    transferred_tokens: int = 0
    # dictated output (then EOS); None: the next-token function decides
    output: OutputPlan | None = None
    group: str = ""  # the caller's id of an n > 1 request: aborting it aborts every sample
    dp_rank: int | None = None  # GenerateRequest.data_parallel_rank (None: the engine picks)


class Scored(NamedTuple):
    """One position's logprobs: the token, its logprob, and the most likely tokens as
    (id, logprob), most likely first."""

    token_id: int
    logprob: float
    ranked: tuple[tuple[int, float], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    matched_token_id: int | None = None  # the EOS or stop token that ended the request
    matched_is_eos: bool = False  # the matched token is the EOS (vLLM does not report it)
    matched_stop_str: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One engine step of one request: the new tokens (a delta) and, on the last, its end."""

    token_ids: tuple[int, ...]
    completion_tokens: int  # cumulative, this step included
    finish: Finish | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (the same every step)
    score: Scored | None = None  # the token's logprobs, when the request asked for them


@dataclasses.dataclass(frozen=True, slots=True)
class LoadSnapshot:
    running_requests: int
    used_tokens: int  # KV slots held by the running requests (shared cached blocks once)
    capacity_tokens: int  # the simulated KV pool
    gen_throughput: float  # generated tokens per second, recent
    last_receive_time: float  # wall-clock time of the last Generate received, 0 if none
    cached_tokens: int = 0  # tokens in the prefix cache, pinned or evictable
    cache_hit_rate: float = 0.0  # cached / total prompt tokens since start


# KV cache events, protocol-neutral. Hashes are the engine's own unsigned 64-bit block ids.


@dataclasses.dataclass(frozen=True, slots=True)
class BlockStored:
    """A chain of full blocks stored; `parent_block_hash` is None for a chain from block 0."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]  # every token of every block, in order
    block_size: int


@dataclasses.dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclasses.dataclass(frozen=True, slots=True)
class EventBatch:
    """One scheduler step's events under the publisher's sequence number."""

    seq: int
    ts: float  # wall clock
    events: tuple[KvEvent, ...]


class EventSink(Protocol):
    """Where the core sends the KV events of a cache operation (batched per step there)."""

    def emit(self, events: Sequence[KvEvent]) -> None: ...
