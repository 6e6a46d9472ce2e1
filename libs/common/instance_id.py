"""Stable instance ids: the same engine URL gives the same 64-bit id in every process.

Ids come from the normalized URL, so a restarted fleet, a second router replica and a
re-added engine all agree on them without any shared state.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import xxhash

_SCHEMES = ("grpc", "grpcs")


class InvalidEngineUrl(ValueError):
    """An engine URL that is not grpc://host:port."""


def normalize_url(url: str) -> str:
    """`grpc://Host:port/` -> `grpc://host:port`. Query and fragment are dropped: per-worker
    options live in the query (see fleet's worker list) and do not change identity."""
    text = url.strip()
    if "://" not in text:
        text = "grpc://" + text
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise InvalidEngineUrl(f"engine URL {url!r}: scheme must be grpc:// (got {scheme}://)")
    try:
        port = parts.port
    except ValueError as exc:
        raise InvalidEngineUrl(f"engine URL {url!r}: bad port") from exc
    host = (parts.hostname or "").lower()
    if not host:
        raise InvalidEngineUrl(f"engine URL {url!r}: missing host")
    if port is None:
        raise InvalidEngineUrl(f"engine URL {url!r}: missing port")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def instance_id(url: str) -> int:
    """Unsigned 64-bit id of an engine URL (XXH3-64 of the normalized form)."""
    return xxhash.xxh3_64_intdigest(normalize_url(url).encode())


def grpc_target(url: str) -> str:
    """The `host:port` target grpc.aio channels take."""
    return normalize_url(url).split("://", 1)[1]
