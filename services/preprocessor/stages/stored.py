"""The Responses API's state around the chat stages (store, previous_response_id,
conversation): the stored context read before the first engine call, the response kept at
its end.

`history` (a prompt stage of /v1/responses, first): an earlier response's input and output
items (`previous_response_id`) or a conversation's items become messages between the
request's instructions and its input, through the chat template as the model saw them; the
earlier response's instructions are not carried over. An id that is not there, or is
another key's, is OpenAI's 400 previous_response_not_found (404 conversation_not_found).
A store that is down fails the request with 503 before anything is generated, or, with
--store-unavailable serve, answers it unstored (`store: false`, an x-switchyard-warning
header); a read it needs is a 503 either way.

`keep` (called by the Responses sinks with the final response object, before its last frame
goes out, so a client that chains at once finds it): the response with its input items
(the context it was given, then its own input) and, in a conversation, the turn's input and
output appended to it, in one transaction. A response too large for --responses-max-bytes
is answered unstored. A response that fails once the engine generated a token is kept as
`failed` (stages/responses); one cut by max_output_tokens as `incomplete`; a client that
disconnects ends the generation and nothing is kept (OpenAI keeps a response that outlives
its connection only in `background` mode). Nothing is written for `store: false`. Item
contents never reach a log line.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import orjson

from switchyard.preprocessor import request_ids
from switchyard.preprocessor.conversations import conversation_not_found, encode_items
from switchyard.preprocessor.errors import INVALID_VALUE, InvalidRequestError
from switchyard.preprocessor.responses_requests import ResponsesRequest, input_messages
from switchyard.preprocessor.stages.context import RequestContext
from switchyard.preprocessor.storage.errors import StoreUnavailable
from switchyard.preprocessor.storage.interface import StoredResponse
from switchyard.preprocessor.stored_items import stored_items

log = logging.getLogger(__name__)

WARNING_HEADER = b"x-switchyard-warning"
KEY = "stored"  # RequestContext.extra's key for a request's Kept


@dataclasses.dataclass(slots=True)
class Kept:
    """What a kept response needs at its end."""

    response_id: str
    input_items: bytes  # the stored context it was given, then its own input (JSON)
    own: list[dict[str, Any]]  # its input items, for its conversation (else none)


def _previous_not_found(response_id: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Previous response with id '{response_id}' not found.",
        "previous_response_not_found",
        "previous_response_id",
    )


def _unstored(ctx: RequestContext, why: str) -> None:
    """Answer without keeping: the response object says store false, a header says why."""
    ctx.extra["shown"] = {"store": False}
    ctx.headers.append((WARNING_HEADER, why.encode("latin-1", "replace")))


async def history(ctx: RequestContext) -> None:
    req = ctx.request
    if not isinstance(req, ResponsesRequest):
        return
    storage = ctx.deps.storage
    reads = req.previous_response_id or req.conversation
    if storage is None:
        if reads:
            param = "previous_response_id" if req.previous_response_id else "conversation"
            raise InvalidRequestError(
                f"'{param}' needs stored responses, which this server does not keep (--store "
                "none): send the earlier turns in 'input' instead.",
                "unsupported_value",
                param,
            )
        if req.store:  # an explicit true: it cannot take effect
            raise InvalidRequestError(
                "'store' must be false or absent: this server keeps no responses (--store none).",
                "unsupported_value",
                "store",
            )
        ctx.extra["shown"] = {"store": False}
        return
    storing = req.store is not False
    fails = storing and storage.config.when_unavailable == "fail"
    if not storage.up and (reads or fails):
        raise StoreUnavailable(storage.reason)  # 503 before any engine work
    if storing and not storage.up:
        _unstored(ctx, "the response store is unavailable: this response is not kept")
        storing = False
        if storage.metrics is not None:
            storage.metrics.errors.labels("put_response", "unavailable_served").inc()
    prior = await _context(ctx, req)
    if prior:
        where = "previous_response_id" if req.previous_response_id else "conversation"
        messages = list(req.messages)
        messages[req.head : req.head] = input_messages(prior, where)
        ctx.body = dataclasses.replace(req, messages=tuple(messages))
    if not storing:
        ctx.extra["shown"] = {"store": False, **ctx.extra.get("shown", {})}
        return
    own = stored_items(req.input, checked=True)
    items = orjson.dumps(prior + own)
    if len(items) > storage.config.max_bytes:
        raise InvalidRequestError(
            f"This response's input items ({len(items)} bytes with the stored context) are "
            f"more than this server keeps ({storage.config.max_bytes}): send 'store': false.",
            INVALID_VALUE,
            "input",
        )
    response_id = ctx.inp.request_id
    if ctx.inp.engine_prefix:  # the client's X-Request-Id: a stored id must be unique
        response_id = request_ids.mint("resp_")
    own_items = own if req.conversation else []
    ctx.extra[KEY] = Kept(response_id, items, own_items)


async def _context(ctx: RequestContext, req: ResponsesRequest) -> list[dict[str, Any]]:
    storage = ctx.deps.storage
    assert storage is not None
    tenant = ctx.inp.tenant
    if req.previous_response_id is not None:
        found = await storage.get_response(tenant, req.previous_response_id)
        if found is None:
            raise _previous_not_found(req.previous_response_id)
        items: list[dict[str, Any]] = orjson.loads(found.input_items)
        return items + orjson.loads(found.body)["output"]
    if req.conversation is not None:
        page = await storage.list_items(tenant, req.conversation)
        if page is None:
            raise conversation_not_found(req.conversation, "conversation")
        return [orjson.loads(item.body) for item in page.items]
    return []


def response_id(ctx: RequestContext) -> str:
    kept: Kept | None = ctx.extra.get(KEY)
    return kept.response_id if kept is not None else ctx.inp.request_id


def shown(ctx: RequestContext) -> dict[str, Any]:
    """The response object's state fields, as this request has them."""
    req = ctx.request
    assert isinstance(req, ResponsesRequest)
    fields: dict[str, Any] = {
        "store": True,
        "previous_response_id": req.previous_response_id,
        "conversation": {"id": req.conversation} if req.conversation else None,
    }
    fields.update(ctx.extra.get("shown", {}))
    return fields


async def keep(ctx: RequestContext, body: dict[str, Any], started: bool) -> bytes | None:
    """Keep the final response object (`body`); its encoding when it went into the store
    unchanged (the sink sends those bytes), else None. `started`: headers already went out
    (no warning header can be added then; the body's `store` still says false)."""
    kept: Kept | None = ctx.extra.pop(KEY, None)  # once: a failure after this is not kept
    storage = ctx.deps.storage
    if kept is None or storage is None:
        return None
    req = ctx.request
    assert isinstance(req, ResponsesRequest)
    encoded = orjson.dumps(body)
    now = time.time()
    record = StoredResponse(
        kept.response_id,
        ctx.inp.tenant,
        int(body.get("created_at") or now),
        storage.response_expiry(now),
        body["status"],
        body["model"],
        encoded,
        kept.input_items,
        req.previous_response_id,
        req.conversation,
    )
    if record.size > storage.config.max_bytes:
        log.warning(
            "response %s not kept: %d bytes, over --responses-max-bytes %d",
            kept.response_id,
            record.size,
            storage.config.max_bytes,
            extra={"request_id": ctx.inp.request_id},
        )
        if storage.metrics is not None:
            storage.metrics.errors.labels("put_response", "too_large").inc()
        _not_kept(ctx, body, started, "the response is larger than the store keeps")
        return None
    appended = encode_items(kept.own + body["output"]) if req.conversation else ()
    try:
        await storage.put_response(record, appended)
    except StoreUnavailable:
        if storage.config.when_unavailable == "fail" or body["status"] == "failed":
            raise
        if storage.metrics is not None:
            storage.metrics.errors.labels("put_response", "unavailable_served").inc()
        _not_kept(ctx, body, started, "the response store is unavailable")
        return None
    return encoded


def _not_kept(ctx: RequestContext, body: dict[str, Any], started: bool, why: str) -> None:
    body["store"] = False
    if not started:
        _unstored(ctx, f"{why}: this response is not kept")
