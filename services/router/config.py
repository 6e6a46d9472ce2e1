"""Routing configuration: frozen, validated types, from a preset (`--router-mode`) or a YAML /
JSON file (`--routing-config`). Anything unknown or out of range raises ValueError naming it.

File format (every key optional; an omitted profile or list takes the mode's preset):

    decode:                       # the profile that picks the worker of a whole request
      filters: [same_model, capable, not_excluded, serves_requests, prefill_reachable,
                not_busy, has_capacity]
      scorers:
        - {name: predicted_ttft, weight: 1}
        - {name: session_affinity, weight: 2, ttl_s: 600}
      picker: max_score           # or {name: weighted_random, temperature: 0.05}
    prefill:                      # the prefill hop's worker (disaggregated serving)
      scorers: [predicted_ttft]
    time: {prefill_ms_per_1k_tokens: 50, base_ms: 25, work_weight: 0.5,
           decode_ms_per_1k_tokens: 5, output_tokens: 256, learn: true}
    bookings: {ttl_s: 10}         # pending bookings of routed prompts (ttl_s 0: off)
    disaggregation:               # prefill/decode orchestration (disagg.py)
      handler: decode_then_prefill
      decider: {name: uncached_tokens, min_uncached_tokens: 256}   # or: always

A plugin is a name or a mapping {name, weight (scorers), ...its parameters}.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from switchyard.router.timing import TimeParams

T = TypeVar("T")

DECODE_FILTERS = (
    "same_model",
    "capable",
    "not_excluded",
    "serves_requests",
    "prefill_reachable",
    "not_busy",
    "has_capacity",
)
PREFILL_FILTERS = (
    "same_model",
    "capable",
    "not_excluded",
    "prefill_role",
    "same_protocol",
    "not_busy",
)
_REQUIRED = {
    "decode": ("same_model", "capable", "serves_requests"),
    "prefill": ("same_model", "capable", "prefill_role", "same_protocol"),
}


@dataclass(frozen=True, slots=True)
class PluginConfig:
    name: str
    weight: float = 1.0
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a plugin name must be a non-empty string, got {self.name!r}")
        if not (isinstance(self.weight, int | float) and math.isfinite(self.weight)):
            raise ValueError(f"{self.name}: weight must be a finite number, got {self.weight!r}")
        if self.weight < 0:
            raise ValueError(f"{self.name}: weight must be >= 0, got {self.weight}")
        object.__setattr__(self, "params", dict(self.params))


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    filters: tuple[PluginConfig, ...]
    scorers: tuple[PluginConfig, ...]
    picker: PluginConfig


@dataclass(frozen=True, slots=True)
class DisaggConfig:
    """Disaggregated serving's profile handler and decider (disagg.py builds and checks
    them; the decider's parameters default to the router's flags)."""

    handler: str = "decode_then_prefill"
    decider: PluginConfig = PluginConfig("uncached_tokens")


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    mode: str
    decode: ProfileConfig
    prefill: ProfileConfig
    time: TimeParams = TimeParams()
    booking_ttl_s: float = 10.0
    disagg: DisaggConfig = DisaggConfig()

    def __post_init__(self) -> None:
        if not self.booking_ttl_s >= 0:
            raise ValueError(f"bookings ttl_s must be >= 0, got {self.booking_ttl_s}")
        for name, profile in (("decode", self.decode), ("prefill", self.prefill)):
            present = {f.name for f in profile.filters}
            missing = [f for f in _REQUIRED[name] if f not in present]
            if missing:
                raise ValueError(f"profile {name!r} must keep the filters {', '.join(missing)}")


def _names(*names: str) -> tuple[PluginConfig, ...]:
    return tuple(PluginConfig(n) for n in names)


def _profile(
    scorers: tuple[PluginConfig, ...], picker: str, filters: tuple[str, ...] = DECODE_FILTERS
) -> ProfileConfig:
    return ProfileConfig(_names(*filters), scorers, PluginConfig(picker))


_PREFILL = _profile(_names("predicted_ttft"), "max_score", PREFILL_FILTERS)
_PREFILL_PLAIN = _profile(_names("inflight_load"), "max_score", PREFILL_FILTERS)

# --router-mode presets: decode profile, prefill profile.
PRESETS: dict[str, tuple[ProfileConfig, ProfileConfig]] = {
    # Predicted time to first token (KV overlap and load in one unit); a session sticks to
    # its worker unless that worker is overloaded.
    "kv": (
        _profile(
            (PluginConfig("predicted_ttft"), PluginConfig("session_affinity", weight=2.0)),
            "max_score",
        ),
        _PREFILL,
    ),
    # llm-d style: weighted cache overlap and load scores.
    "kv_overlap": (
        _profile(
            (
                PluginConfig("kv_overlap", weight=2.0),
                PluginConfig("inflight_load"),
                PluginConfig("engine_load"),
            ),
            "max_score",
        ),
        _PREFILL,
    ),
    "round_robin": (_profile((), "round_robin"), _PREFILL_PLAIN),
    "random": (_profile((), "random"), _PREFILL_PLAIN),
    "least_loaded": (_profile(_names("inflight_load"), "max_score"), _PREFILL_PLAIN),
    "session": (
        _profile(
            (PluginConfig("session_affinity", weight=2.0), PluginConfig("inflight_load")),
            "max_score",
        ),
        _PREFILL_PLAIN,
    ),
    "consistent_hash": (_profile(_names("consistent_hash"), "max_score"), _PREFILL_PLAIN),
}
MODES = tuple(PRESETS)


def preset(mode: str, time: TimeParams | None = None, booking_ttl_s: float = 10.0) -> RoutingConfig:
    if mode not in PRESETS:
        raise ValueError(f"unknown router mode {mode!r}; choose from {', '.join(MODES)}")
    decode, prefill = PRESETS[mode]
    return RoutingConfig(mode, decode, prefill, time or TimeParams(), booking_ttl_s)


def parse_params(cls: type[T], raw: Mapping[str, Any], where: str) -> T:
    """A frozen dataclass from config values: unknown keys, wrong types and the dataclass's
    own checks raise ValueError naming `where`."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        known = ", ".join(fields) or "none"
        raise ValueError(f"{where}: unknown parameter {', '.join(unknown)} (known: {known})")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        kind = (
            type(fields[name].default) if fields[name].default is not dataclasses.MISSING else None
        )
        if kind is bool and not isinstance(value, bool):
            raise ValueError(f"{where}: {name} must be true or false, got {value!r}")
        if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{where}: {name} must be a number, got {value!r}")
        if kind is int and not isinstance(value, int):
            raise ValueError(f"{where}: {name} must be an integer, got {value!r}")
        values[name] = float(value) if kind is float else value
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _plugin(raw: Any, where: str) -> PluginConfig:
    if isinstance(raw, str):
        return PluginConfig(raw)
    if isinstance(raw, Mapping) and isinstance(raw.get("name"), str):
        params = {k: v for k, v in raw.items() if k not in ("name", "weight")}
        weight = raw.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"{where} {raw['name']}: weight must be a number, got {weight!r}")
        return PluginConfig(raw["name"], float(weight), params)
    raise ValueError(f"{where}: a plugin is a name or a mapping with a name, got {raw!r}")


def _profile_from(raw: Any, default: ProfileConfig, where: str) -> ProfileConfig:
    if raw is None:
        return default
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {raw!r}")
    unknown = sorted(set(raw) - {"filters", "scorers", "picker"})
    if unknown:
        raise ValueError(f"{where}: unknown key {', '.join(unknown)}")
    lists = {}
    for key in ("filters", "scorers"):
        value = raw.get(key)
        if value is None:
            lists[key] = getattr(default, key)
        elif isinstance(value, list):
            lists[key] = tuple(_plugin(item, f"{where}.{key}") for item in value)
        else:
            raise ValueError(f"{where}.{key}: expected a list, got {value!r}")
    picker = default.picker if raw.get("picker") is None else _plugin(raw["picker"], where)
    return ProfileConfig(lists["filters"], lists["scorers"], picker)


def _disagg_from(raw: Any) -> DisaggConfig:
    if raw is None:
        return DisaggConfig()
    if not isinstance(raw, Mapping):
        raise ValueError(f"routing config disaggregation: expected a mapping, got {raw!r}")
    unknown = sorted(set(raw) - {"handler", "decider"})
    if unknown:
        raise ValueError(f"routing config disaggregation: unknown key {', '.join(unknown)}")
    default = DisaggConfig()
    handler = raw.get("handler", default.handler)
    if not isinstance(handler, str):
        raise ValueError(f"routing config disaggregation.handler: a name, got {handler!r}")
    decider = raw.get("decider")
    if isinstance(decider, Mapping) and "weight" in decider:
        raise ValueError("routing config disaggregation.decider: a decider takes no weight")
    if decider is None:
        return DisaggConfig(handler, default.decider)
    return DisaggConfig(handler, _plugin(decider, "disaggregation.decider"))


def from_mapping(raw: Mapping[str, Any], mode: str = "kv") -> RoutingConfig:
    base = preset(mode)
    unknown = sorted(set(raw) - {"decode", "prefill", "time", "bookings", "disaggregation"})
    if unknown:
        raise ValueError(f"routing config: unknown key {', '.join(unknown)}")
    time = raw.get("time")
    bookings = raw.get("bookings") or {}
    if not isinstance(bookings, Mapping) or set(bookings) - {"ttl_s"}:
        raise ValueError(f"routing config bookings: expected {{ttl_s: seconds}}, got {bookings!r}")
    ttl = bookings.get("ttl_s", base.booking_ttl_s)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise ValueError(f"routing config bookings.ttl_s must be a number, got {ttl!r}")
    return RoutingConfig(
        mode,
        _profile_from(raw.get("decode"), base.decode, "decode"),
        _profile_from(raw.get("prefill"), base.prefill, "prefill"),
        parse_params(TimeParams, time, "time") if time is not None else base.time,
        float(ttl),
        _disagg_from(raw.get("disaggregation")),
    )


def load(path: str | Path, mode: str = "kv") -> RoutingConfig:
    """A routing config file (YAML or JSON)."""
    text = Path(path).read_text(encoding="utf-8")
    raw = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: a routing config is a mapping, got {type(raw).__name__}")
    return from_mapping(raw, mode)
