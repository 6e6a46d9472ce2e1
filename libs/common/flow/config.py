"""The flow-control policy file (`--flow-config`, YAML or JSON), read by the routers (the
deployment's gate) and the preprocessors (who a request is, its priority and objective; the
gate they run themselves when no router answers). Every key but `max_running` is optional:

    max_running: 16            # sequences running at once in the whole deployment
    burst: 8                   # more, only for requests that outrank a running one
                               # (default max_running / 2)
    max_queued: 128            # requests waiting in the deployment (default 8 x max_running)
    queue_timeout_s: 30        # a queued request waits at most this long
    share_window_s: 10         # how far back a flow's share of admitted tokens is measured
    tenant_header: x-tenant-id # a flow per value of this header (set by a trusted proxy);
                               # without it (or the header) a flow per API key
    default_priority: 0        # a number or a class name
    classes: {interactive: -10, batch: 10}   # named priorities: lower is served first
    flows:                     # per flow; `default` is every flow not named here
      default: {weight: 1}
      acme: {weight: 2, priority: interactive, min_priority: interactive,
             ttft_objective_ms: 800, max_requests: 64}
    keys:                      # API keys' flows, by the key's SHA-256 (hex), never the key
      9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08: acme

Anything unknown or out of range raises ValueError naming it. Priorities follow vLLM's
`priority` field: any integer, lower served first. A flow's `priority` is its requests'
default, its `min_priority` the most urgent one they may ask for.

Metric labels stay bounded: a flow's label is its name when the file names it, `default`
for requests with no flow identity, else `other`; a priority's label is its class's name,
`default` for the default priority, else `other`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_FLOW = "default"  # a request with no flow identity, and the template of unnamed flows
OTHER = "other"  # the metric label of everything the file does not name
KEY_FLOW_PREFIX = "key:"  # the flow of an API key the file does not map: key:<12 hex>
PRIORITY_HEADER = b"x-priority"
OBJECTIVE_HEADER = b"x-ttft-objective-ms"
INT32 = 2**31
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=~-]{0,63}")
_CLASS = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
_HEADER = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_HEX = re.compile(r"[0-9a-f]{64}")
_TOP = {
    "max_running",
    "burst",
    "max_queued",
    "queue_timeout_s",
    "share_window_s",
    "tenant_header",
    "default_priority",
    "classes",
    "flows",
    "keys",
}
_FLOW_KEYS = {"weight", "priority", "min_priority", "ttft_objective_ms", "max_requests"}


def valid_flow_name(name: str) -> bool:
    """A flow name (a tenant header value, a name in the file): what fits a log field and a
    metric label unescaped."""
    return _NAME.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class FlowSpec:
    weight: float = 1.0  # its share of a band, relative to the other flows there
    priority: int | None = None  # its requests' default priority (None: the file's default)
    min_priority: int | None = None  # the most urgent priority they may ask (None: any)
    ttft_objective_ms: float | None = None  # its requests' default TTFT objective
    max_requests: int = 0  # running + queued at once, deployment-wide (0: no cap)


@dataclass(frozen=True)
class FlowConfig:
    max_running: int
    burst: int
    max_queued: int
    queue_timeout_s: float = 30.0
    share_window_s: float = 10.0
    tenant_header: bytes | None = None  # lower-case, as ASGI gives header names
    default_priority: int = 0
    classes: Mapping[str, int] = field(default_factory=dict)
    flows: Mapping[str, FlowSpec] = field(default_factory=dict)
    keys: Mapping[str, str] = field(default_factory=dict)  # key SHA-256 (hex) -> flow
    digest: str = ""  # of the file's content: replicas compare theirs

    def spec(self, flow: str) -> FlowSpec:
        """The flow's entry, else the `default` entry (every unnamed flow has its own share
        and cap, with these values)."""
        found = self.flows.get(flow)
        if found is None:
            found = self.flows.get(DEFAULT_FLOW, _DEFAULT_SPEC)
        return found

    def flow_label(self, flow: str) -> str:
        if flow in self.flows or flow == DEFAULT_FLOW:
            return flow
        return OTHER

    def priority_label(self, priority: int) -> str:
        for name, value in self.classes.items():
            if value == priority:
                return name
        return DEFAULT_FLOW if priority == self.default_priority else OTHER

    def labels(self) -> tuple[list[str], list[str]]:
        """Every flow label and every priority label the metrics can carry."""
        flows = sorted({*self.flows, DEFAULT_FLOW, OTHER})
        priorities = sorted({*self.classes, DEFAULT_FLOW, OTHER})
        return flows, priorities

    def priority_value(self, raw: Any, where: str) -> int:
        """A priority as the file, a header or a body gives it: an integer or a class name."""
        if isinstance(raw, str) and raw in self.classes:
            return self.classes[raw]
        if isinstance(raw, str):
            try:
                raw = int(raw)
            except ValueError:
                known = ", ".join(self.classes) or "none"
                raise ValueError(
                    f"{where}: {raw!r} is neither an integer nor a priority class "
                    f"(classes: {known})"
                ) from None
        return _priority(raw, where)


_DEFAULT_SPEC = FlowSpec()


def _number(raw: Any, where: str, low: float, high: float = math.inf, *, strict=False) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"{where} must be a number, got {raw!r}")
    value = float(raw)
    if not (low < value if strict else low <= value) or not value < high:
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ValueError(f"{where} must be {bound} and < {high:g}, got {raw!r}")
    return value


def _whole(raw: Any, where: str, low: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"{where} must be a whole number, got {raw!r}")
    if raw < low or raw >= INT32:
        raise ValueError(f"{where} must be at least {low} (and below 2^31), got {raw}")
    return raw


def _priority(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"{where} must be an integer or a class name, got {raw!r}")
    if not -INT32 <= raw < INT32:
        raise ValueError(f"{where} must fit in 32 bits, got {raw}")
    return raw


def _classes(raw: Any) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"classes: expected a mapping of name: priority, got {raw!r}")
    out = {}
    for name, value in raw.items():
        if not isinstance(name, str) or _CLASS.fullmatch(name) is None:
            raise ValueError(f"classes: {name!r} is not a class name (a letter, then letters, "
                             "digits, _ or -)")  # fmt: skip
        if name in (DEFAULT_FLOW, OTHER):
            raise ValueError(f"classes: {name!r} is reserved (a metric label)")
        out[name] = _priority(value, f"classes.{name}")
    return out


def _named_priority(raw: Any, classes: Mapping[str, int], where: str) -> int:
    if isinstance(raw, str):
        if raw not in classes:
            known = ", ".join(classes) or "none"
            raise ValueError(f"{where}: unknown class {raw!r} (classes: {known})")
        return classes[raw]
    return _priority(raw, where)


def _flow(raw: Any, classes: Mapping[str, int], where: str) -> FlowSpec:
    if raw is None:
        return FlowSpec()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {raw!r}")
    unknown = sorted(set(raw) - _FLOW_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {', '.join(unknown)} (known: "
                         f"{', '.join(sorted(_FLOW_KEYS))})")  # fmt: skip
    spec = FlowSpec(
        weight=_number(raw.get("weight", 1.0), f"{where}.weight", 0.0, 1e6, strict=True),
        priority=None
        if raw.get("priority") is None
        else _named_priority(raw["priority"], classes, f"{where}.priority"),
        min_priority=None
        if raw.get("min_priority") is None
        else _named_priority(raw["min_priority"], classes, f"{where}.min_priority"),
        ttft_objective_ms=None
        if raw.get("ttft_objective_ms") is None
        else _number(raw["ttft_objective_ms"], f"{where}.ttft_objective_ms", 0.0, 1e9, strict=True),
        max_requests=_whole(raw.get("max_requests", 0), f"{where}.max_requests", 0),
    )
    if (
        spec.priority is not None
        and spec.min_priority is not None
        and spec.priority < spec.min_priority
    ):
        raise ValueError(f"{where}: priority {spec.priority} is more urgent than its "
                         f"min_priority {spec.min_priority}")  # fmt: skip
    return spec


def from_mapping(raw: Mapping[str, Any]) -> FlowConfig:
    unknown = sorted(set(raw) - _TOP)
    if unknown:
        raise ValueError(f"unknown key {', '.join(unknown)} (known: {', '.join(sorted(_TOP))})")
    if "max_running" not in raw:
        raise ValueError("max_running is required: the sequences the deployment runs at once")
    max_running = _whole(raw["max_running"], "max_running", 1)
    burst = _whole(raw.get("burst", max_running // 2), "burst", 0)
    max_queued = _whole(raw.get("max_queued", 8 * max_running), "max_queued", 0)
    classes = _classes(raw.get("classes"))
    flows_raw = raw.get("flows") or {}
    if not isinstance(flows_raw, Mapping):
        raise ValueError(f"flows: expected a mapping of name: settings, got {flows_raw!r}")
    flows = {}
    for name, spec in flows_raw.items():
        if not isinstance(name, str) or not valid_flow_name(name) or name == OTHER:
            raise ValueError(f"flows: {name!r} is not a flow name (1 to 64 letters, digits "
                             f"and ._:@/+=~-, not {OTHER!r})")  # fmt: skip
        if name.startswith(KEY_FLOW_PREFIX):
            raise ValueError(f"flows: {name!r}: the prefix {KEY_FLOW_PREFIX!r} is reserved")
        flows[name] = _flow(spec, classes, f"flows.{name}")
    keys_raw = raw.get("keys") or {}
    if not isinstance(keys_raw, Mapping):
        raise ValueError(f"keys: expected a mapping of key SHA-256: flow, got {keys_raw!r}")
    keys = {}
    for digest, flow in keys_raw.items():
        text = str(digest).lower()
        if _HEX.fullmatch(text) is None:
            raise ValueError(f"keys: {str(digest)[:12]!r}... is not a SHA-256 in hex (64 "
                             "characters): give the key's digest, never the key")  # fmt: skip
        if not isinstance(flow, str) or flow not in flows:
            raise ValueError(f"keys.{text[:12]}...: {flow!r} is not a flow of `flows`")
        keys[text] = flow
    header = raw.get("tenant_header")
    if header is not None and (
        not isinstance(header, str) or not _HEADER.fullmatch(header.lower())
    ):
        raise ValueError(f"tenant_header: {header!r} is not an HTTP header name")
    default = raw.get("default_priority", 0)
    canonical = json.dumps(raw, sort_keys=True, default=str).encode()
    return FlowConfig(
        max_running=max_running,
        burst=burst,
        max_queued=max_queued,
        queue_timeout_s=_number(
            raw.get("queue_timeout_s", 30.0), "queue_timeout_s", 0.0, 86400.0, strict=True
        ),
        share_window_s=_number(
            raw.get("share_window_s", 10.0), "share_window_s", 0.0, 86400.0, strict=True
        ),
        tenant_header=header.lower().encode() if header else None,
        default_priority=_named_priority(default, classes, "default_priority"),
        classes=classes,
        flows=flows,
        keys=keys,
        digest=hashlib.sha256(canonical).hexdigest()[:12],
    )


def load(path: str | Path) -> FlowConfig:
    """A flow-control file; ValueError (naming the file) for anything unusable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"flow config {path}: {exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"flow config {path}: not valid YAML: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ValueError(f"flow config {path}: expected a mapping, got {type(raw).__name__}")
    try:
        return from_mapping(raw)
    except ValueError as exc:
        raise ValueError(f"flow config {path}: {exc}") from None
