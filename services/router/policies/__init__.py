"""Routing policies, one per module, all behind types.Policy.

Layout: `round_robin`, `random_choice`, `least_loaded`; `build_policy(mode, rng)` is the
registry. KV-aware routing plugs in here as one more policy (its own issue).
"""

from __future__ import annotations

import random

from switchyard.router.policies.least_loaded import LeastLoaded
from switchyard.router.policies.random_choice import RandomChoice
from switchyard.router.policies.round_robin import RoundRobin
from switchyard.router.types import Policy

POLICIES = {
    RoundRobin.name: RoundRobin,
    RandomChoice.name: RandomChoice,
    LeastLoaded.name: LeastLoaded,
}


def build_policy(mode: str, rng: random.Random | None = None) -> Policy:
    try:
        cls = POLICIES[mode]
    except KeyError:
        raise ValueError(f"unknown router mode {mode!r}; choose from {sorted(POLICIES)}") from None
    return cls(rng or random.Random())
