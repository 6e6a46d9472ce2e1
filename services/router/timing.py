"""The router's time model: predicted time to first token (TTFT) per worker, in seconds.

    ttft(w)  = base(w) + queue(w) + prefill(w)
    prefill  = uncached prompt tokens there x seconds per token(w)
    queue    = prefill tokens already queued there x seconds per token(w)
               + running requests there x running_penalty
    decode   = decode seconds per KV token
               x (KV tokens in flight there + requests there x output_tokens)
    cost(w)  = ttft(w) + work_weight x prefill(w) + decode(w)

`queue` counts the router's own bookkeeping (prompt tokens routed there and not prefilled
yet) or the engine's report of its queued prefill work, whichever is larger (each is a lower
bound: the router sees only its own requests, the report lags). The work term prices the
prefill a choice adds to the worker, which delays whatever comes next there: a request whose
prefix is being prefilled on one worker right now waits about as long there as it would take
to compute it elsewhere, and the work term is what keeps it there instead of computing the
prefix twice.

The decode term prices the batch a request joins (Dynamo's router weighs active decode
blocks 1:1 with blocks to prefill): every step reads the KV of every running sequence, so a
token of KV in flight slows each step there. By the arithmetic of a GPU's memory bandwidth
(an 8B model: ~0.04 ms per 1k tokens of KV per step), over 256 output steps, 1k tokens in
flight cost a request joining them ~10 ms, a fifth of what the prior says 1k tokens take to
prefill. That slowdown lands on inter-token latency, not on the first token the rest of the
cost is about, so the default is half of it, 5 ms per 1k: a conversation's cached prefix
still outweighs half a dozen long conversations running beside it, and long decodes still
spread over idle engines. It is in absolute time, not a share of the learned prefill speed:
an engine whose prefill looks free (a mock, a tiny prompt) still has a decode batch. KV in
flight is what each request added beyond what the worker held when it was routed (a shared
prefix is held once, as Dynamo counts its active blocks), so a burst sharing a prefix adds
little. The router sees prompts, not outputs: each request in flight counts `output_tokens`
more.

Speeds are learned from the router's own observations (route -> first token, for requests
prefilled where they were routed): an exponentially weighted least-squares fit of observed
TTFT against the prefill tokens ahead of and in the request, shrunk towards the configured
prior when the observations do not spread enough to tell slope from base. Each worker has
its own slope, shrunk the same way towards the fleet's; its fixed part is the fit pooled
over the whole fleet plus the worker's own offset from it (`TimeModel`). A worker with too
few observations of its own (new, or rarely chosen) is priced by the fleet's fit, once that
has enough: the prior is a guess, the fleet's engines are usually alike, and a new worker
that looks faster (or slower) than it is draws every request (or none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from switchyard.router.types import WorkerKey

_MIN_SAMPLES = 8
_SPREAD = 32.0**2  # token^2: how much x-variance counts as much as the prior
_ALPHA = 0.1  # weight of each new observation once warmed up
_LEVEL_ALPHA = 0.3  # the fleet's level follows a delay every worker sees within a few
OFFSET_HALF_LIFE_S = 60.0  # a worker's offset from the fleet fades while it is not timed


def _check(name: str, value: float, low: float = 0.0, high: float = math.inf) -> float:
    if not (low <= value <= high) or math.isnan(value):
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value}")
    return float(value)


@dataclass(frozen=True, slots=True)
class TimeParams:
    """The time model's configuration (validated: bad values raise ValueError)."""

    prefill_ms_per_1k_tokens: float = 50.0  # prior speed: 20k tokens/s
    base_ms: float = 25.0  # prior fixed cost of a first token
    running_penalty_ms: float = 0.2  # each running request slows a new prefill this much
    work_weight: float = 0.5  # weight of the prefill work a choice adds (see module doc)
    decode_ms_per_1k_tokens: float = 5.0  # what 1k tokens of KV in flight cost a newcomer
    output_tokens: int = 256  # what each request in flight is assumed to add to its KV
    offload_weight: float = 0.8  # share of a block's prefill an offloaded-tier hit saves
    learn: bool = True  # learn speeds from observed TTFT

    def __post_init__(self) -> None:
        _check("prefill_ms_per_1k_tokens", self.prefill_ms_per_1k_tokens, 1e-6, 1e6)
        _check("base_ms", self.base_ms, 0.0, 1e6)
        _check("running_penalty_ms", self.running_penalty_ms, 0.0, 1e6)
        _check("work_weight", self.work_weight, 0.0, 100.0)
        _check("decode_ms_per_1k_tokens", self.decode_ms_per_1k_tokens, 0.0, 1e6)
        if not isinstance(self.output_tokens, int) or isinstance(self.output_tokens, bool):
            raise ValueError(f"output_tokens must be an integer, got {self.output_tokens!r}")
        _check("output_tokens", self.output_tokens, 0, 1_000_000)
        _check("offload_weight", self.offload_weight, 0.0, 1.0)

    @property
    def per_token_s(self) -> float:
        return self.prefill_ms_per_1k_tokens / 1e6

    @property
    def decode_per_token_s(self) -> float:
        return self.decode_ms_per_1k_tokens / 1e6

    @property
    def base_s(self) -> float:
        return self.base_ms / 1e3


class PrefillSpeed:
    """A fitted TTFT = base + slope x tokens. With `fit=False` (a worker's own observations,
    whose slope the cost reads through `slope_toward`) `slope` and `base` are brought up to
    date only by `refit()`, not on every observation."""

    __slots__ = ("n", "mx", "my", "vxx", "cxy", "slope", "base", "_prior_slope", "_fit")

    def __init__(self, prior_slope: float, prior_base: float, *, fit: bool = True) -> None:
        self.n = 0
        self.mx = self.my = self.vxx = self.cxy = 0.0
        self._prior_slope = prior_slope
        self._fit = fit
        self.slope = prior_slope
        self.base = prior_base

    def observe(self, tokens: float, seconds: float) -> None:
        if tokens < 0 or not seconds >= 0 or seconds > 600:
            return
        self.n += 1
        a = max(_ALPHA, 1.0 / self.n)
        dx = tokens - self.mx
        self.mx += a * dx
        dy = seconds - self.my
        self.my += a * dy
        self.vxx = (1 - a) * (self.vxx + a * dx * dx)
        self.cxy = (1 - a) * (self.cxy + a * dx * dy)
        if self._fit:
            self.refit()

    def refit(self) -> None:
        """`slope` and `base` from the observations so far (the prior's until there are
        enough), shrunk towards the prior slope."""
        if self.n < _MIN_SAMPLES:
            return
        prior = self._prior_slope
        slope = (self.cxy + _SPREAD * prior) / (self.vxx + _SPREAD)
        slope = min(max(slope, prior / 50), prior * 50)
        self.slope = slope
        self.base = min(max(self.my - slope * self.mx, 0.0), 60.0)

    def slope_toward(self, target: float) -> float:
        """The slope of these observations shrunk towards `target` (the fleet's) instead of
        the prior: a worker whose prompts barely differ in length cannot tell its slope from
        noise, and then it is priced like its peers."""
        if self.n < _MIN_SAMPLES:
            return target
        prior = self._prior_slope
        slope = (self.cxy + _SPREAD * target) / (self.vxx + _SPREAD)
        return min(max(slope, prior / 50), prior * 50)


class Speed(NamedTuple):
    """What the cost reads for one worker: seconds per prefill token, and the fixed part."""

    slope: float
    base: float


class _Worker:
    """One worker's learning: its own fit (for its slope) and its offset from the fleet."""

    __slots__ = ("own", "offset", "n", "at")

    def __init__(self, own: PrefillSpeed) -> None:
        self.own = own
        self.offset = 0.0  # seconds it answers slower (+) or faster (-) than the fleet's fit
        self.n = 0  # observations in the offset
        self.at = 0.0  # when the offset last learned

    def offset_at(self, now: float | None) -> float:
        if now is None or now <= self.at:
            return self.offset
        return self.offset * 0.5 ** ((now - self.at) / OFFSET_HALF_LIFE_S)


class TimeModel:
    """The speeds the cost uses, learned from first tokens.

    The slope is each worker's own fit once it has enough observations, shrunk towards the
    fleet's (as far as its prompts' lengths do not spread enough to tell). The fixed part is
    the fleet's fit (every worker's observations, pooled) plus the worker's offset from it:
    the mean of what its first tokens took beyond what the fleet's fit said at the time. A
    delay every worker sees at once (a busy gateway, a loaded host) moves the fleet's fit,
    not one worker's price. Fitted on its own, the base of whichever worker was timed
    during a busy spell stayed high once it was no longer chosen, so it was not chosen
    again (docs/benchmarks.md, "The time model's fixed part"). An offset also fades
    (half-life `OFFSET_HALF_LIFE_S`) while the worker is not timed, so a worker that was
    slow once is tried again."""

    def __init__(self, params: TimeParams | None = None) -> None:
        self.params = params or TimeParams()
        self._workers: dict[WorkerKey, _Worker] = {}
        self._fleet = self._new_speed()  # every worker's observations, pooled
        # The fleet's fixed part now: what first tokens took beyond their prefill, fast.
        self._level = self.params.base_s

    def _new_speed(self, *, fit: bool = True) -> PrefillSpeed:
        return PrefillSpeed(self.params.per_token_s, self.params.base_s, fit=fit)

    def _worker(self, key: WorkerKey) -> _Worker:
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = _Worker(self._new_speed(fit=False))
        return worker

    def own_speed(self, key: WorkerKey) -> PrefillSpeed:
        """The fit of this worker's own observations (the prior until it has some)."""
        own = self._worker(key).own
        own.refit()
        return own

    def speed(self, key: WorkerKey, now: float | None = None) -> Speed:
        """The speed the cost uses at `now` (the prior until the fleet has observations)."""
        fleet = self._fleet
        level = self._level if fleet.n >= _MIN_SAMPLES else fleet.base  # (the prior)
        worker = self._workers.get(key)
        if worker is None:
            return Speed(fleet.slope, level)
        slope = worker.own.slope_toward(fleet.slope)
        if worker.n < _MIN_SAMPLES:
            return Speed(slope, level)
        return Speed(slope, min(max(level + worker.offset_at(now), 0.0), 60.0))

    def observe(
        self, key: WorkerKey, tokens: float, seconds: float, now: float | None = None
    ) -> None:
        """A request routed to `key` had `tokens` of prefill ahead of and in it (as the router
        saw at routing time) and its first token came `seconds` later (at `now`)."""
        if not self.params.learn or tokens < 0 or not 0 <= seconds <= 600:
            return
        worker = self._worker(key)
        fleet = self._fleet
        own = worker.own
        fixed = seconds - own.slope_toward(fleet.slope) * tokens
        if fleet.n >= _MIN_SAMPLES:  # an offset from a learned level, not from the prior
            offset = worker.offset_at(now)
            worker.n += 1
            worker.offset = offset + max(_ALPHA, 1.0 / worker.n) * (fixed - self._level - offset)
            if now is not None:
                worker.at = now
        self._level += max(_LEVEL_ALPHA, 1.0 / (fleet.n + 1)) * (fixed - self._level)
        own.observe(tokens, seconds)
        fleet.observe(tokens, seconds)

    def forget(self, key: WorkerKey) -> None:
        self._workers.pop(key, None)
