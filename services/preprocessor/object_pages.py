"""What the stored-object routes share: the caller's tenant, JSON bodies read within a
limit, list queries (limit, order, after, before, include) checked like request fields, and
list pages in OpenAI's shape.

    {"object": "list", "data": [...], "first_id": ..., "last_id": ..., "has_more": ...}

Every query parameter either takes effect or is a 400 naming it, as body fields are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Request

from .auth import TENANT_SCOPE
from .errors import (
    INVALID_JSON,
    INVALID_REQUEST,
    INVALID_VALUE,
    UNKNOWN_FIELD,
    UNSUPPORTED_VALUE,
    InvalidRequestError,
    RequestError,
)

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def tenant(request: Request) -> str:
    """Whose objects this request may see ("" on a server without client keys)."""
    return str(request.scope.get(TENANT_SCOPE, ""))


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, refused past `limit` bytes (413) or when not JSON (400)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(
                413,
                f"The request body is larger than {limit} bytes.",
                INVALID_REQUEST,
                "request_too_large",
            )
        parts.append(chunk)
    body = b"".join(parts)
    if not body:
        return {}
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(
            f"We could not parse the JSON body of your request: {exc}", INVALID_JSON
        ) from None


@dataclass(frozen=True, slots=True)
class ListQuery:
    limit: int = DEFAULT_LIMIT
    descending: bool = True  # OpenAI's default order is desc
    after: str | None = None
    before: str | None = None


def list_query(request: Request, before: bool = False) -> ListQuery:
    """`limit`, `order`, `after` (and `before` where the route has it); `include` may be
    empty only (nothing here has an optional part to include)."""
    allowed = {"limit", "order", "after", "include", "include[]"} | (
        {"before"} if before else set()
    )
    fields: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name not in allowed:
            raise InvalidRequestError(
                f"Unrecognized request argument supplied: {name}", UNKNOWN_FIELD, name
            )
        if name.startswith("include"):
            refuse_include([value])
            continue
        fields[name] = value
    limit = DEFAULT_LIMIT
    if "limit" in fields:
        try:
            limit = int(fields["limit"])
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidRequestError(
                f"Invalid 'limit': {fields['limit']!r}; expected a whole number from 1 to "
                f"{MAX_LIMIT}.",
                INVALID_VALUE,
                "limit",
            )
    order = fields.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequestError(
            f"Invalid 'order': {order!r}; expected 'asc' or 'desc'.", INVALID_VALUE, "order"
        )
    if fields.get("after") and fields.get("before"):
        raise InvalidRequestError("Give 'after' or 'before', not both.", INVALID_VALUE, "before")
    return ListQuery(limit, order == "desc", fields.get("after"), fields.get("before"))


def refuse_include(values: Iterable[str]) -> None:
    for value in values:
        if value:
            raise InvalidRequestError(
                f"'include' {value!r} is not offered by this server: its items have no "
                "optional parts (no logprobs, no encrypted reasoning).",
                UNSUPPORTED_VALUE,
                "include",
            )


def only_fields(request: Request, allowed: Sequence[str] = ()) -> None:
    """A route that takes no query parameter (but `allowed`): any other is a 400."""
    for name, value in request.query_params.multi_items():
        if name.startswith("include") and "include" in allowed:
            refuse_include([value])
        elif name not in allowed:
            raise InvalidRequestError(
                f"Unrecognized request argument supplied: {name}", UNKNOWN_FIELD, name
            )


def page_of(items: Sequence[dict[str, Any]], query: ListQuery) -> bytes:
    """One page of items kept in order, as a list body (`after`/`before` name an item id;
    one that is not there gives an empty page)."""
    ordered = list(reversed(items)) if query.descending else list(items)
    ids = [item.get("id") for item in ordered]
    start, end = 0, len(ordered)
    if query.after is not None:
        start = ids.index(query.after) + 1 if query.after in ids else end
    if query.before is not None:
        end = ids.index(query.before) if query.before in ids else 0
        start = max(0, end - query.limit)
        chosen = ordered[start:end]
        return list_body(
            [orjson.dumps(i) for i in chosen], [str(i["id"]) for i in chosen], start > 0
        )
    chosen = ordered[start : start + query.limit]
    more = start + query.limit < end
    return list_body([orjson.dumps(i) for i in chosen], [str(i["id"]) for i in chosen], more)


def list_body(bodies: Sequence[bytes], ids: Sequence[str], has_more: bool) -> bytes:
    """A list object around items already encoded (stored bytes are not parsed again)."""
    head = {"first_id": ids[0] if ids else None, "last_id": ids[-1] if ids else None}
    tail = orjson.dumps({**head, "has_more": has_more})
    return b'{"object":"list","data":[' + b",".join(bodies) + b"]," + tail[1:]
