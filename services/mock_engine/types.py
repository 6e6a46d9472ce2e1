"""Protocol-neutral request and event types shared by the core and the protocol adapters."""

from __future__ import annotations

import dataclasses
import enum


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


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingSpec


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


@dataclasses.dataclass(frozen=True, slots=True)
class LoadSnapshot:
    running_requests: int
    used_tokens: int  # prompt + generated tokens of the running requests
    capacity_tokens: int  # the simulated KV pool
    gen_throughput: float  # generated tokens per second, recent
    last_receive_time: float  # wall-clock time of the last Generate received, 0 if none
