"""/v1/conversations: OpenAI's Conversations API over the store.

    POST   /v1/conversations                      {items?, metadata?}: a new conversation
    GET    /v1/conversations/{id}                 it
    POST   /v1/conversations/{id}                 {metadata}: replaced
    DELETE /v1/conversations/{id}                 it and its items
    GET    /v1/conversations/{id}/items           a page (limit, order, after)
    POST   /v1/conversations/{id}/items           {items}: appended (at most 20 at a time)
    GET    /v1/conversations/{id}/items/{item}    one item
    DELETE /v1/conversations/{id}/items/{item}    one item (answers with the conversation)

POST /v1/responses with `conversation` reads its items as the context and appends the
turn's input and output (stages: see responses_requests). Items are checked as a response's
input is (stored_items), so every one can go back into a prompt. Each conversation belongs
to the API key that made it; another key gets 404, as for an id that never existed.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

import msgspec
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from msgspec import Meta, Struct

from .errors import ObjectNotFoundError
from .object_pages import list_body, list_query, only_fields, read_json, tenant
from .openai_requests import _validation_error
from .responses_schema import Metadata
from .storage.interface import Conversation, StoredItem
from .storage.service import Storage
from .stored_items import stored_items
from .stored_responses import StoreDisabledError

JSON = "application/json"
MAX_ITEMS = 20  # per call, as OpenAI
_CONFIG = {"forbid_unknown_fields": True, "frozen": True, "kw_only": True}


class CreateBody(Struct, **_CONFIG):  # type: ignore[call-arg]
    items: Annotated[list[Any], Meta(max_length=MAX_ITEMS)] | None = None
    metadata: Metadata | None = None


class UpdateBody(Struct, **_CONFIG):  # type: ignore[call-arg]
    metadata: Metadata | None


class ItemsBody(Struct, **_CONFIG):  # type: ignore[call-arg]
    items: Annotated[list[Any], Meta(min_length=1, max_length=MAX_ITEMS)]


def conversation_not_found(conversation_id: str, param: str | None = None) -> ObjectNotFoundError:
    return ObjectNotFoundError(
        f"Conversation with id '{conversation_id}' not found.", "conversation_not_found", param
    )


def conversation_object(conversation: Conversation) -> bytes:
    return orjson.dumps(
        {
            "id": conversation.id,
            "object": "conversation",
            "created_at": conversation.created_at,
            "metadata": orjson.Fragment(conversation.metadata),
        }
    )


def encode_items(items: list[dict[str, Any]]) -> list[StoredItem]:
    return [StoredItem(item["id"], orjson.dumps(item)) for item in items]


def _convert(value: Any, kind: type) -> Any:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc)) from None


def add_routes(app: FastAPI, storage: Storage | None, max_bytes: int) -> None:
    def store() -> Storage:
        if storage is None:
            raise StoreDisabledError()
        return storage

    async def existing(request: Request, conversation_id: str) -> Conversation:
        found = await store().get_conversation(tenant(request), conversation_id)
        if found is None:
            raise conversation_not_found(conversation_id)
        return found

    @app.post("/v1/conversations")
    async def create(request: Request) -> Response:
        only_fields(request)
        storage = store()
        body: CreateBody = _convert(await read_json(request, max_bytes), CreateBody)
        items = stored_items(body.items, "items") if body.items else []
        conversation = Conversation(
            f"conv_{uuid.uuid4().hex}",
            tenant(request),
            int(time.time()),
            storage.conversation_expiry(time.time()),
            orjson.dumps(body.metadata or {}),
        )
        await storage.create_conversation(conversation, encode_items(items))
        return Response(conversation_object(conversation), media_type=JSON)

    @app.get("/v1/conversations/{conversation_id}")
    async def retrieve(conversation_id: str, request: Request) -> Response:
        only_fields(request)
        return Response(
            conversation_object(await existing(request, conversation_id)), media_type=JSON
        )

    @app.post("/v1/conversations/{conversation_id}")
    async def update(conversation_id: str, request: Request) -> Response:
        only_fields(request)
        body: UpdateBody = _convert(await read_json(request, max_bytes), UpdateBody)
        metadata = orjson.dumps(body.metadata or {})
        found = await store().update_conversation(tenant(request), conversation_id, metadata)
        if found is None:
            raise conversation_not_found(conversation_id)
        return Response(conversation_object(found), media_type=JSON)

    @app.delete("/v1/conversations/{conversation_id}")
    async def delete(conversation_id: str, request: Request) -> Response:
        only_fields(request)
        if not await store().delete_conversation(tenant(request), conversation_id):
            raise conversation_not_found(conversation_id)
        body = {"id": conversation_id, "object": "conversation.deleted", "deleted": True}
        return Response(orjson.dumps(body), media_type=JSON)

    @app.get("/v1/conversations/{conversation_id}/items")
    async def list_items(conversation_id: str, request: Request) -> Response:
        query = list_query(request)
        page = await store().list_items(
            tenant(request), conversation_id, query.after, query.limit, query.descending
        )
        if page is None:
            raise conversation_not_found(conversation_id)
        ids = [item.id for item in page.items]
        return Response(
            list_body([i.body for i in page.items], ids, page.has_more), media_type=JSON
        )

    @app.post("/v1/conversations/{conversation_id}/items")
    async def add_items(conversation_id: str, request: Request) -> Response:
        only_fields(request, ("include", "include[]"))
        body: ItemsBody = _convert(await read_json(request, max_bytes), ItemsBody)
        items = encode_items(stored_items(body.items, "items"))
        if not await store().add_items(tenant(request), conversation_id, items):
            raise conversation_not_found(conversation_id)
        return Response(
            list_body([i.body for i in items], [i.id for i in items], False), media_type=JSON
        )

    @app.get("/v1/conversations/{conversation_id}/items/{item_id}")
    async def get_item(conversation_id: str, item_id: str, request: Request) -> Response:
        only_fields(request, ("include", "include[]"))
        found = await store().get_item(tenant(request), conversation_id, item_id)
        if found is None:
            await existing(request, conversation_id)  # which of the two is missing
            raise _item_not_found(item_id)
        return Response(found.body, media_type=JSON)

    @app.delete("/v1/conversations/{conversation_id}/items/{item_id}")
    async def delete_item(conversation_id: str, item_id: str, request: Request) -> Response:
        only_fields(request)
        if not await store().delete_item(tenant(request), conversation_id, item_id):
            await existing(request, conversation_id)
            raise _item_not_found(item_id)
        return Response(
            conversation_object(await existing(request, conversation_id)), media_type=JSON
        )


def _item_not_found(item_id: str) -> ObjectNotFoundError:
    return ObjectNotFoundError(f"Item with id '{item_id}' not found.", "item_not_found")
