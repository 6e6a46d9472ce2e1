"""Contracts of the router core: what a routing plugin sees and implements. Plugins, the
framework and the service import these, never the reverse.

A decision runs one profile: filters -> weighted scorers -> picker (see `framework`).

- `Worker`: one routable KV cache, an (instance, data-parallel rank) pair. Built once per
  fleet snapshot; its `load` (the router's own bookkeeping) and `engine` (the engine's own
  load report) are updated in place as requests are routed and reports arrive.
- `RouteContext`: one decision's inputs, plus what the framework computed because a plugin
  declared it needs it (`Needs`): the prompt's block hashes and each worker's cached prefix,
  the session key.
- `Filter.filter` keeps a subset of the candidates; `Scorer.score` returns one score per
  candidate, higher is better, which the framework clamps to [0, 1] and weighs; `Picker.pick`
  chooses one candidate from the weighted totals. Plugins never time themselves.
- `ProfileHandler.run` decides which profiles a decision runs over which workers (disaggregated
  serving: the decode profile, then maybe the prefill profile), asking its `Decider` whether a
  request takes the prefill hop (disagg.py has them).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from switchyard.protos.messages import Instance, RouteRequest

if TYPE_CHECKING:
    from switchyard.router.framework import Outcome, Profile
    from switchyard.router.timing import TimeModel

WorkerKey = tuple[int, int]  # (instance id, data-parallel rank)


class Needs(enum.Flag):
    """What a plugin reads beyond the worker list; the framework computes only these."""

    NONE = 0
    BLOCKS = enum.auto()  # the prompt's block hashes and every worker's cached prefix
    ENGINE_LOAD = enum.auto()  # the engines' own load reports (the router polls GetLoads)
    SESSION = enum.auto()  # the request's session key and its sticky worker


class RouterLoad:
    """The router's own bookkeeping of what it routed to a worker (tokens, not blocks)."""

    __slots__ = ("in_flight", "in_prefill", "prefill_tokens", "active_tokens", "kv_tokens")

    def __init__(self) -> None:
        self.in_flight = 0  # routed and not finished
        self.in_prefill = 0  # of those, no first token yet
        self.prefill_tokens = 0  # uncached prompt tokens of those not prefilled yet
        self.active_tokens = 0  # prompt tokens of every request in flight
        # Of those, the ones not cached there when routed: the KV the requests in flight
        # added (a shared prefix is held once, as Dynamo counts its active blocks).
        self.kv_tokens = 0


class EngineLoad:
    """The engine's own report for one rank (GetLoads, or the KV-event stream's records)."""

    __slots__ = (
        "running",
        "waiting",
        "waiting_uncached_tokens",
        "kv_usage",
        "max_running",
        "at",
    )

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.waiting_uncached_tokens: int | None = None  # None: the engine does not say
        self.kv_usage = 0.0  # fraction of the KV pool in use
        self.max_running = 0  # its admission window (0: unknown)
        self.at = -1.0  # monotonic time of the report (-1: none yet)


class Worker:
    __slots__ = ("key", "instance", "rank", "load", "engine")

    def __init__(self, instance: Instance, rank: int, load: RouterLoad, engine: EngineLoad):
        self.key: WorkerKey = (instance.instance_id, rank)
        self.instance = instance
        self.rank = rank
        self.load = load
        self.engine = engine

    @property
    def instance_id(self) -> int:
        return self.instance.instance_id

    @property
    def dp_rank(self) -> int | None:
        """The rank to pin a request to (None for an engine without data parallelism)."""
        return self.rank if self.instance.dp_size > 1 else None

    def max_running(self) -> int:
        """The rank's admission window: the engine's report, else what fleet learned (split
        over the ranks, as SGLang's DP attention splits --max-running-requests)."""
        if self.engine.max_running:
            return self.engine.max_running
        return self.instance.max_running_requests

    def __repr__(self) -> str:
        return f"Worker({self.key[0]}/{self.key[1]})"


@dataclass(slots=True)
class Explanation:
    """What the time model says about one worker, in seconds and tokens (dry runs show it)."""

    ttft_s: float = 0.0
    prefill_s: float = 0.0
    queue_s: float = 0.0
    cached_tokens: int = 0
    pending_tokens: int = 0
    decode_s: float = 0.0  # the decode term: the batch it would join there


@dataclass(slots=True)
class RouteContext:
    request: RouteRequest
    now: float
    time: TimeModel
    explain: bool = False  # a dry run: plugins may record why (see `explanations`)
    engine_stale_s: float = 10.0  # an engine report older than this reads as none
    # ---- set by the core for its filters ----
    hop_protocols: frozenset[str] = frozenset()  # protocols with a routable prefill worker
    busy: dict[int, float] = field(default_factory=dict)  # instance id -> busy until
    decode_protocol: str = ""  # the prefill profile: the chosen decode worker's protocol
    # ---- computed for Needs.BLOCKS ----
    # block size -> the prompt's block hashes (the core's are computed as read)
    hashes: dict[int, Sequence[int]] = field(default_factory=dict)
    prompt_blocks: int = 0
    device_blocks: dict[WorkerKey, int] = field(default_factory=dict)
    any_tier_blocks: dict[WorkerKey, int] = field(default_factory=dict)  # empty: no offload
    pending_blocks: dict[WorkerKey, int] = field(default_factory=dict)  # booked, not stored
    # ---- computed for Needs.SESSION ----
    session: str | None = None
    # ---- written by plugins ----
    explanations: dict[WorkerKey, Explanation] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.token_ids)

    def engine_report(self, worker: Worker) -> EngineLoad | None:
        """The worker's engine load report, None when there is none or it is stale."""
        load = worker.engine
        if load.at < 0 or self.now - load.at > self.engine_stale_s:
            return None
        return load


class Filter(Protocol):
    name: str
    needs: Needs

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]: ...


class Scorer(Protocol):
    name: str
    needs: Needs

    def score(self, ctx: RouteContext, workers: Sequence[Worker]) -> Sequence[float]: ...


class Picker(Protocol):
    name: str
    needs: Needs

    def pick(self, ctx: RouteContext, workers: Sequence[Worker], totals: Sequence[float]) -> int:
        """The index of the chosen worker in `workers`."""
        ...


class Decider(Protocol):
    """Disaggregated serving: whether a request routed to `decode` prefills on another
    engine (the prefill hop) rather than on `decode` itself. Asked only when a prefill worker
    of the decode worker's protocol exists."""

    name: str
    needs: Needs

    def disaggregate(self, ctx: RouteContext, decode: Worker) -> bool: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """What a profile handler made of a request: the decode profile's outcome, the prefill
    profile's (when it ran: for a hop, or to show it in a dry run) and the hop's worker."""

    decode: Outcome
    prefill: Outcome | None = None
    hop: Worker | None = None


class ProfileHandler(Protocol):
    """Which profiles a decision runs, over which workers, and what comes of it."""

    name: str
    needs: Needs

    def run(
        self,
        ctx: RouteContext,
        decode: Profile,
        prefill: Profile,
        workers: list[Worker],
        prefill_workers: list[Worker],
    ) -> Decision: ...


class Observer(Protocol):
    """A plugin that learns from the outcome (a session table, a round-robin cursor)."""

    def observe(self, ctx: RouteContext, chosen: Worker) -> None: ...


@dataclass(frozen=True, slots=True)
class PluginDeps:
    """What a plugin may be built with: randomness is passed in, never global."""

    rng: random.Random
    time: TimeModel


@dataclass(frozen=True, slots=True)
class NoParams:
    """The Params of a plugin that takes none but is built with its PluginDeps."""
