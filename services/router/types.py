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


@dataclass(frozen=True, slots=True)
class RouteContext:
    request_id: str
    model: str
    token_ids: Sequence[int]


class Policy(Protocol):
    """Picks one worker among candidates (never empty)."""

    name: str

    def pick(self, candidates: Sequence[WorkerView], ctx: RouteContext) -> WorkerView: ...
