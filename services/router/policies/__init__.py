"""Routing plugins, one per module, each behind one interface of `types` (Filter, Scorer or
Picker); `PLUGINS` is the registry (one line per plugin) and `build_profile` makes a
framework Profile from validated config.

Layout: filters `same_model`, `capable`, `not_excluded`, `serves_requests`,
`prefill_reachable`, `local_prefill`, `not_busy`, `has_capacity`, `prefill_role`,
`same_protocol`; scorers
`predicted_ttft`, `kv_overlap`, `inflight_load`, `engine_load`, `session_affinity`,
`consistent_hash`; pickers `max_score`, `weighted_random`, `round_robin`, `random_choice`.

A plugin class has `name` and `needs`; one with a `Params` frozen dataclass is built as
`cls(params, deps)` (params parsed from config, raising on unknown or bad values), one
without is built as `cls()` and takes no parameters.
"""

from __future__ import annotations

from typing import Any

from switchyard.router.config import PluginConfig, ProfileConfig, parse_params
from switchyard.router.framework import PluginStats, Profile
from switchyard.router.policies.capable import Capable
from switchyard.router.policies.consistent_hash import ConsistentHash
from switchyard.router.policies.engine_load import EngineLoadScorer
from switchyard.router.policies.has_capacity import HasCapacity
from switchyard.router.policies.inflight_load import InflightLoad
from switchyard.router.policies.kv_overlap import KvOverlap
from switchyard.router.policies.local_prefill import LocalPrefill
from switchyard.router.policies.max_score import MaxScore
from switchyard.router.policies.not_busy import NotBusy
from switchyard.router.policies.not_excluded import NotExcluded
from switchyard.router.policies.predicted_ttft import PredictedTtft
from switchyard.router.policies.prefill_reachable import PrefillReachable
from switchyard.router.policies.prefill_role import PrefillRole
from switchyard.router.policies.random_choice import RandomChoice
from switchyard.router.policies.round_robin import RoundRobin
from switchyard.router.policies.same_model import SameModel
from switchyard.router.policies.same_protocol import SameProtocol
from switchyard.router.policies.serves_requests import ServesRequests
from switchyard.router.policies.session_affinity import SessionAffinity
from switchyard.router.policies.weighted_random import WeightedRandom
from switchyard.router.types import Filter, Picker, PluginDeps, Scorer

FILTERS: dict[str, type] = {
    "same_model": SameModel,
    "capable": Capable,
    "not_excluded": NotExcluded,
    "serves_requests": ServesRequests,
    "prefill_reachable": PrefillReachable,
    "local_prefill": LocalPrefill,
    "not_busy": NotBusy,
    "has_capacity": HasCapacity,
    "prefill_role": PrefillRole,
    "same_protocol": SameProtocol,
}
SCORERS: dict[str, type] = {
    "predicted_ttft": PredictedTtft,
    "kv_overlap": KvOverlap,
    "inflight_load": InflightLoad,
    "engine_load": EngineLoadScorer,
    "session_affinity": SessionAffinity,
    "consistent_hash": ConsistentHash,
}
PICKERS: dict[str, type] = {
    "max_score": MaxScore,
    "weighted_random": WeightedRandom,
    "round_robin": RoundRobin,
    "random": RandomChoice,
}
PLUGINS = {"filter": FILTERS, "scorer": SCORERS, "picker": PICKERS}


def build_plugin(kind: str, config: PluginConfig, deps: PluginDeps) -> Any:
    registry = PLUGINS[kind]
    cls = registry.get(config.name)
    if cls is None:
        raise ValueError(
            f"unknown {kind} {config.name!r}; choose from {', '.join(sorted(registry))}"
        )
    params_type = getattr(cls, "Params", None)
    if params_type is None:
        if config.params:
            raise ValueError(f"{kind} {config.name!r} takes no parameters")
        return cls()
    return cls(parse_params(params_type, config.params, f"{kind} {config.name!r}"), deps)


def build_profile(
    name: str, config: ProfileConfig, deps: PluginDeps, stats: PluginStats | None = None
) -> Profile:
    filters: list[Filter] = [build_plugin("filter", f, deps) for f in config.filters]
    scorers: list[tuple[Scorer, float]] = [
        (build_plugin("scorer", s, deps), s.weight) for s in config.scorers
    ]
    picker: Picker = build_plugin("picker", config.picker, deps)
    return Profile(name, filters, scorers, picker, stats)
