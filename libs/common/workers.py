"""The operator's worker list: engine URLs plus per-worker options, parsed into frozen specs.

A worker comes from a `--worker` flag or a workers file entry:

    grpc://h:30000
    grpc://h:30000?kv_events=tcp://h:5557&kv_replay=tcp://h:5558&role=prefill
    grpc://h:30000?kv_bind=tcp://*:5557&kv_topic=engine-a&kv_replay=tcp://h:5558

`kv_events` is where the engine's KV-event publisher is bound (the router connects there);
`kv_bind` is where the router binds for an engine whose publisher connects (its configured
endpoint names the router's host), `kv_topic` the topic it publishes under. Both override what
the engine reports (SGLang reports its kv_events_config; vLLM reports nothing).

A workers file is YAML (`.yaml`/`.yml`) or JSON (`.json`) holding a list whose items are such
strings or mappings `{url, kv_events, kv_replay, kv_bind, kv_topic, role, model}` (only `url`
required). `role`
is `prefill` or `decode`; only `prefill` changes anything (see fleet's role resolution).
`model` overrides the model id the engine reports. Anything else fails loudly: a ValueError
that names the entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import parse_qsl

import yaml

from switchyard.common.instance_id import instance_id as _instance_id
from switchyard.common.instance_id import normalize_url

OPTIONS = ("kv_events", "kv_replay", "kv_bind", "kv_topic", "role", "model")
ROLES = ("prefill", "decode")
_ENDPOINT_SCHEMES = ("tcp", "ipc", "inproc")
_YAML_SUFFIXES = (".yaml", ".yml")
_JSON_SUFFIXES = (".json",)


@dataclass(frozen=True)
class WorkerSpec:
    """One configured engine. `url` is normalized on construction (raises ValueError when it
    is not grpc://host:port) and `instance_id` derives from it."""

    url: str
    kv_events: str | None = None  # overrides the endpoint the engine advertises
    kv_replay: str | None = None
    kv_bind: str | None = None  # the router binds here for the engine's connecting publisher
    kv_topic: str | None = None  # the topic the engine publishes under
    prefill: bool = False  # listed as prefill by the operator
    model: str | None = None  # overrides the engine's served model name
    instance_id: int = field(init=False)

    def __post_init__(self) -> None:
        url = normalize_url(self.url)
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "instance_id", _instance_id(url))
        for name in ("kv_events", "kv_replay", "kv_bind"):
            value = getattr(self, name)
            if value is not None:
                _endpoint(name, value)
        if self.kv_events is not None and self.kv_bind is not None:
            raise ValueError("give kv_events (the engine binds) or kv_bind (it connects), not both")
        if self.kv_topic is not None and not isinstance(self.kv_topic, str):
            raise ValueError(f"kv_topic must be a string, got {self.kv_topic!r}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ValueError(f"model must be a non-empty string, got {self.model!r}")


def _endpoint(name: str, value: object) -> str:
    if not isinstance(value, str) or "://" not in value:
        raise ValueError(f"{name} must be a ZMQ endpoint like tcp://host:port, got {value!r}")
    if value.split("://", 1)[0] not in _ENDPOINT_SCHEMES:
        raise ValueError(f"{name} {value!r}: scheme must be one of {', '.join(_ENDPOINT_SCHEMES)}")
    return value


def _spec(url: object, options: Mapping[str, object]) -> WorkerSpec:
    if not isinstance(url, str) or not url.strip():
        raise ValueError("missing url")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown option {', '.join(unknown)} (expected {', '.join(OPTIONS)})")
    role = options.get("role")
    if role is not None and role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    kv_events, kv_replay = options.get("kv_events"), options.get("kv_replay")
    kv_bind, kv_topic = options.get("kv_bind"), options.get("kv_topic")
    if kv_topic is not None and not isinstance(kv_topic, str):
        raise ValueError(f"kv_topic must be a string, got {kv_topic!r}")
    model = options.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model must be a string, got {model!r}")
    return WorkerSpec(
        url,
        kv_events=None if kv_events is None else _endpoint("kv_events", kv_events),
        kv_replay=None if kv_replay is None else _endpoint("kv_replay", kv_replay),
        kv_bind=None if kv_bind is None else _endpoint("kv_bind", kv_bind),
        kv_topic=kv_topic,
        prefill=role == "prefill",
        model=model,
    )


def _split_query(text: str) -> tuple[str, dict[str, str]]:
    """`grpc://h:p?a=1&b=2` -> (`grpc://h:p`, {a: 1, b: 2}); a repeated key is an error."""
    base, _, query = text.strip().partition("?")
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in options:
            raise ValueError(f"option {key} given twice")
        options[key] = value
    return base, options


def worker_flag(url: str, **options: str | None) -> str:
    """The `--worker` value of `url` with its options (what parse_worker reads); options
    that are None are left out."""
    unknown = [name for name in options if name not in OPTIONS]
    if unknown:
        raise ValueError(f"unknown worker option(s) {unknown}")
    query = "&".join(f"{name}={value}" for name, value in options.items() if value is not None)
    return f"{url}?{query}" if query else url


def parse_worker(text: str) -> WorkerSpec:
    """A `--worker` value: a URL whose query holds the options."""
    try:
        base, options = _split_query(text)
        return _spec(base, options)
    except ValueError as exc:
        raise ValueError(f"worker {text!r}: {exc}") from None


def parse_worker_entry(entry: object, where: str = "worker") -> WorkerSpec:
    """One workers-file item: a URL string (options in its query) or a mapping. A key given
    both in the mapping and in its url's query is an error."""
    if isinstance(entry, str):
        try:
            base, options = _split_query(entry)
            return _spec(base, options)
        except ValueError as exc:
            raise ValueError(f"{where} {entry!r}: {exc}") from None
    if isinstance(entry, Mapping):
        url = entry.get("url")
        try:
            if not isinstance(url, str):
                raise ValueError("missing url" if url is None else f"url must be a string: {url!r}")
            base, options = _split_query(url)
            extra = {str(k): v for k, v in entry.items() if k != "url" and v is not None}
            both = sorted(set(options) & set(extra))
            if both:
                raise ValueError(f"{', '.join(both)} given both as a key and in the url")
            return _spec(base, {**options, **extra})
        except ValueError as exc:
            raise ValueError(f"{where} {dict(entry)!r}: {exc}") from None
    raise ValueError(f"{where} {entry!r}: expected a URL string or a mapping with a url")


def parse_workers(entries: object, source: str = "workers") -> list[WorkerSpec]:
    """A list of entries (see parse_worker_entry); `source` names it in errors."""
    if not isinstance(entries, list):
        raise ValueError(
            f"{source}: expected a list of workers, got {type(entries).__name__}"
            + (" (an empty file is rejected: write [] for no workers)" if entries is None else "")
        )
    return [parse_worker_entry(item, f"{source} entry {n}") for n, item in enumerate(entries, 1)]


def parse_workers_text(text: str, path: str | Path) -> list[WorkerSpec]:
    """Parse a workers file's content; the format comes from `path`'s extension."""
    suffix = Path(path).suffix.lower()
    if suffix in _YAML_SUFFIXES:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
    elif suffix in _JSON_SUFFIXES:
        try:
            data = json.loads(text) if text.strip() else None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
    else:
        raise ValueError(f"{path}: workers file must end in .yaml, .yml or .json")
    return parse_workers(data, str(path))


def combine_workers(
    groups: Iterable[Iterable[WorkerSpec]], prefill: Iterable[str] = ()
) -> list[WorkerSpec]:
    """One list from several sources (flags, a file), ordered by url. The same URL listed
    twice with the same options collapses; with different options it is an error. URLs in
    `prefill` (the `--prefill` flag) are marked prefill wherever they appear; a `prefill` URL
    that is not listed does nothing (it may appear in the workers file later)."""
    prefill_ids = set()
    for url in prefill:
        try:
            prefill_ids.add(_instance_id(url))
        except ValueError as exc:
            raise ValueError(f"prefill {url!r}: {exc}") from None
    by_id: dict[int, WorkerSpec] = {}
    for group in groups:
        for spec in group:
            if spec.instance_id in prefill_ids and not spec.prefill:
                spec = replace(spec, prefill=True)
            seen = by_id.setdefault(spec.instance_id, spec)
            if seen != spec:
                raise ValueError(f"worker {spec.url} listed twice with different options")
    return sorted(by_id.values(), key=lambda spec: spec.url)
