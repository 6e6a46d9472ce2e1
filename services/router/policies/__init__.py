"""Routing policies, one per module, all behind types.Policy.

Layout: `round_robin`, `random_choice`, `least_loaded`, `kv` (KV-overlap and load cost);
`build_policy(mode, rng, kv_params)` is the registry.
"""

from __future__ import annotations

import random

from switchyard.router.policies.kv import KvAware, KvParams
from switchyard.router.policies.least_loaded import LeastLoaded
from switchyard.router.policies.random_choice import RandomChoice
from switchyard.router.policies.round_robin import RoundRobin
from switchyard.router.types import Policy

MODES = (KvAware.name, RoundRobin.name, RandomChoice.name, LeastLoaded.name)


def build_policy(
    mode: str, rng: random.Random | None = None, kv_params: KvParams | None = None
) -> Policy:
    rng = rng or random.Random()
    if mode == KvAware.name:
        return KvAware(rng, kv_params)
    if mode == RoundRobin.name:
        return RoundRobin(rng)
    if mode == RandomChoice.name:
        return RandomChoice(rng)
    if mode == LeastLoaded.name:
        return LeastLoaded(rng)
    raise ValueError(f"unknown router mode {mode!r}; choose from {', '.join(MODES)}")
