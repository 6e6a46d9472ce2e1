"""The router's time model: predicted time to first token (TTFT) per worker, in seconds.

    ttft(w)  = base(w) + queue(w) + prefill(w)
    prefill  = uncached prompt tokens there x seconds per token(w)
    queue    = prefill tokens already queued there x seconds per token(w)
               + running requests there x running_penalty
    cost(w)  = ttft(w) + work_weight x prefill(w)

`queue` counts the router's own bookkeeping (prompt tokens routed there and not prefilled
yet) or the engine's report of its queued prefill work, whichever is larger (each is a lower
bound: the router sees only its own requests, the report lags). The work term prices the
prefill a choice adds to the worker, which delays whatever comes next there: a request whose
prefix is being prefilled on one worker right now waits about as long there as it would take
to compute it elsewhere, and the work term is what keeps it there instead of computing the
prefix twice.

Speeds are learned per worker from the router's own observations (route -> first token, for
requests prefilled where they were routed): an exponentially weighted least-squares fit of
observed TTFT against the prefill tokens ahead of and in the request, shrunk towards the
configured prior when the observations do not spread enough to tell slope from base.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from switchyard.router.types import WorkerKey

_MIN_SAMPLES = 8
_SPREAD = 32.0**2  # token^2: how much x-variance counts as much as the prior
_ALPHA = 0.1  # weight of each new observation once warmed up


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
    offload_weight: float = 0.8  # share of a block's prefill an offloaded-tier hit saves
    learn: bool = True  # learn speeds from observed TTFT

    def __post_init__(self) -> None:
        _check("prefill_ms_per_1k_tokens", self.prefill_ms_per_1k_tokens, 1e-6, 1e6)
        _check("base_ms", self.base_ms, 0.0, 1e6)
        _check("running_penalty_ms", self.running_penalty_ms, 0.0, 1e6)
        _check("work_weight", self.work_weight, 0.0, 100.0)
        _check("offload_weight", self.offload_weight, 0.0, 1.0)

    @property
    def per_token_s(self) -> float:
        return self.prefill_ms_per_1k_tokens / 1e6

    @property
    def base_s(self) -> float:
        return self.base_ms / 1e3


class PrefillSpeed:
    """One worker's fitted TTFT = base + slope x tokens."""

    __slots__ = ("n", "mx", "my", "vxx", "cxy", "slope", "base", "_prior_slope", "_prior_base")

    def __init__(self, prior_slope: float, prior_base: float) -> None:
        self.n = 0
        self.mx = self.my = self.vxx = self.cxy = 0.0
        self._prior_slope = prior_slope
        self._prior_base = prior_base
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
        if self.n < _MIN_SAMPLES:
            return
        prior = self._prior_slope
        slope = (self.cxy + _SPREAD * prior) / (self.vxx + _SPREAD)
        slope = min(max(slope, prior / 50), prior * 50)
        self.slope = slope
        self.base = min(max(self.my - slope * self.mx, 0.0), 60.0)


class TimeModel:
    def __init__(self, params: TimeParams | None = None) -> None:
        self.params = params or TimeParams()
        self._speeds: dict[WorkerKey, PrefillSpeed] = {}

    def speed(self, key: WorkerKey) -> PrefillSpeed:
        speed = self._speeds.get(key)
        if speed is None:
            p = self.params
            speed = self._speeds[key] = PrefillSpeed(p.per_token_s, p.base_s)
        return speed

    def observe(self, key: WorkerKey, tokens: float, seconds: float) -> None:
        """A request routed to `key` had `tokens` of prefill ahead of and in it (as the router
        saw at routing time) and its first token came `seconds` later."""
        if self.params.learn:
            self.speed(key).observe(tokens, seconds)

    def forget(self, key: WorkerKey) -> None:
        self._speeds.pop(key, None)
