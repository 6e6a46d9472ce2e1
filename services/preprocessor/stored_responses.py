"""GET and DELETE /v1/responses/{id}, GET .../input_items, POST .../cancel: the responses
that POST /v1/responses kept (`store`, true unless the request said false).

Each response belongs to the API key that made it: another key, like an id that never
existed or expired, gets 404 ("Response with id '...' not found."). A response's input
items are what it was generated from, oldest first: an earlier response's input and output
when it continued one (`previous_response_id`), a conversation's items, then its own input;
its `instructions` are not items. `cancel` is for background responses, which this server
does not run: a stored response gets 400, an unknown one 404.
"""

from __future__ import annotations

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from .errors import INVALID_REQUEST, InvalidRequestError, ObjectNotFoundError, RequestError
from .object_pages import list_query, only_fields, page_of, tenant
from .storage.service import Storage

JSON = "application/json"
NOT_FOUND = "response_not_found"


def response_not_found(response_id: str, param: str | None = None) -> ObjectNotFoundError:
    return ObjectNotFoundError(f"Response with id '{response_id}' not found.", NOT_FOUND, param)


class StoreDisabledError(RequestError):
    def __init__(self) -> None:
        super().__init__(
            404,
            "This server keeps no responses or conversations (it runs with --store none).",
            INVALID_REQUEST,
            "store_disabled",
        )


def _no_replay(request: Request) -> None:
    for name in ("stream", "starting_after", "include_obfuscation"):
        if name in request.query_params:
            raise InvalidRequestError(
                f"'{name}' replays a background response's events; this server runs no "
                "background responses, so a stored one is read whole.",
                "unsupported_value",
                name,
            )


def add_routes(app: FastAPI, storage: Storage | None) -> None:
    def store() -> Storage:
        if storage is None:
            raise StoreDisabledError()
        return storage

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> Response:
        _no_replay(request)
        only_fields(request, ("include", "include[]"))
        found = await store().get_response(tenant(request), response_id)
        if found is None:
            raise response_not_found(response_id)
        return Response(found.body, media_type=JSON)

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request) -> Response:
        only_fields(request)
        if not await store().delete_response(tenant(request), response_id):
            raise response_not_found(response_id)
        body = {"id": response_id, "object": "response", "deleted": True}
        return Response(orjson.dumps(body), media_type=JSON)

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, request: Request) -> Response:
        query = list_query(request, before=True)
        found = await store().get_response(tenant(request), response_id)
        if found is None:
            raise response_not_found(response_id)
        return Response(page_of(orjson.loads(found.input_items), query), media_type=JSON)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str, request: Request) -> Response:
        only_fields(request)
        if await store().get_response(tenant(request), response_id) is None:
            raise response_not_found(response_id)
        raise InvalidRequestError(
            "Cannot cancel a synchronous response: only background responses can be "
            "cancelled, and this server runs none ('background' is not offered).",
            "response_not_cancellable",
        )
