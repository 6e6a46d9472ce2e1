"""The test API server's wire details: Status objects, JSON lines, query booleans, as the
real API server writes and reads them."""

from __future__ import annotations

import datetime
import json
from typing import Any

from aiohttp import web

Pod = dict[str, Any]


def status(code: int, reason: str, message: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": extra.pop("metadata", {}),
        "status": "Failure",
        "message": message,
        "reason": reason,
        **extra,
        "code": code,
    }


def labels(pod: Pod | None) -> dict[str, str]:
    return ((pod or {}).get("metadata") or {}).get("labels") or {}


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


KNOWN_PARAMS = {
    "labelSelector",
    "limit",
    "continue",
    "resourceVersion",
    "resourceVersionMatch",
    "watch",
    "allowWatchBookmarks",
    "timeoutSeconds",
}


def parse_bool(text: str) -> bool:
    """Query booleans as the API server reads them (Go's strconv.ParseBool)."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"invalid boolean value {text!r}")


def key(pod: Pod) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def json_reply(code: int, body: dict[str, Any]) -> web.Response:
    return web.Response(
        status=code, body=json.dumps(body).encode(), content_type="application/json"
    )


def fail(code: int, reason: str, message: str, **extra: Any) -> web.Response:
    """An error answer: the HTTP code with its Status object."""
    return json_reply(code, status(code, reason, message, **extra))
