"""Contracts of the router core. Policies and the service import these, never the reverse."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A routable worker as a policy sees it at decision time."""

    instance_id: int
    url: str
    model: str
    role: str
    in_flight: int  # requests routed here and not finished (router bookkeeping)
    in_prefill: int  # of those, how many have not produced a first token yet
    overlap_blocks: int = 0  # leading blocks of this request the worker holds (KV index)
    pending_prefill_blocks: int = 0  # prefill blocks of in-flight requests not yet prefilled
    active_blocks: int = 0  # KV blocks of all in-flight requests


@dataclass(frozen=True, slots=True)
class RouteContext:
    request_id: str
    model: str
    token_ids: Sequence[int]
    prompt_blocks: int = 0  # full blocks of the prompt (0 when no policy asked for blocks)


@dataclass(frozen=True, slots=True)
class Decision:
    chosen: WorkerView
    costs: dict[int, float]  # instance id -> the policy's cost (lower is better)


class Policy(Protocol):
    """Picks one worker among candidates (never empty)."""

    name: str
    # The core hashes the prompt into blocks and asks the KV index only for policies that
    # say they need it.
    needs_overlap: bool

    def pick(self, candidates: Sequence[WorkerView], ctx: RouteContext) -> Decision: ...
