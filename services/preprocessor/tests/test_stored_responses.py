"""GET/DELETE /v1/responses/{id}, its input_items and cancel over a real SQLite store,
through the edge with two client keys (the records are put as POST /v1/responses keeps
them; tests/test_stored_responses.py makes them through the whole stack)."""

from __future__ import annotations

import time

import orjson
import pytest

from switchyard.preprocessor.auth import digest
from switchyard.preprocessor.storage.interface import StoredResponse

from .stored_app import KEYS, stored_app

ALICE, BOB = KEYS
ITEMS = [{"id": f"msg_{i}", "type": "message", "role": "user", "content": []} for i in range(5)]


@pytest.fixture
async def app(tmp_path):
    async for clients, state in stored_app(tmp_path):
        body = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
        await state.storage.put_response(
            StoredResponse(
                "resp_1",
                digest(ALICE).hex(),
                int(time.time()),
                None,
                "completed",
                "m",
                orjson.dumps(body),
                orjson.dumps(ITEMS),
            )
        )
        yield clients


class TestRetrieve:
    async def test_the_body_as_it_was_answered(self, app):
        reply = await app[ALICE].get("/v1/responses/resp_1")
        assert reply.status_code == 200 and reply.json()["id"] == "resp_1"

    async def test_unknown_and_another_keys_are_the_same_404(self, app):
        for client, rid in ((app[ALICE], "resp_2"), (app[BOB], "resp_1")):
            reply = await client.get(f"/v1/responses/{rid}")
            assert reply.status_code == 404
            assert reply.json()["error"] == {
                "message": f"Response with id '{rid}' not found.",
                "type": "invalid_request_error",
                "param": None,
                "code": "response_not_found",
            }

    @pytest.mark.parametrize(
        "query, param",
        [
            ("stream=true", "stream"),
            ("starting_after=3", "starting_after"),
            ("include=reasoning.encrypted_content", "include"),
            ("verbose=1", "verbose"),
        ],
    )
    async def test_query_parameters_take_effect_or_are_400(self, app, query, param):
        reply = await app[ALICE].get(f"/v1/responses/resp_1?{query}")
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param


class TestDelete:
    async def test_deleted_once(self, app):
        assert (await app[BOB].delete("/v1/responses/resp_1")).status_code == 404
        reply = await app[ALICE].delete("/v1/responses/resp_1")
        assert reply.json() == {"id": "resp_1", "object": "response", "deleted": True}
        assert (await app[ALICE].get("/v1/responses/resp_1")).status_code == 404
        assert (await app[ALICE].delete("/v1/responses/resp_1")).status_code == 404


class TestInputItems:
    async def page(self, client, query: str = "") -> dict:
        reply = await client.get(f"/v1/responses/resp_1/input_items{query}")
        assert reply.status_code == 200, reply.text
        return reply.json()

    async def test_newest_first_by_default(self, app):
        page = await self.page(app[ALICE])
        assert [i["id"] for i in page["data"]] == ["msg_4", "msg_3", "msg_2", "msg_1", "msg_0"]
        assert page["first_id"] == "msg_4" and page["last_id"] == "msg_0"
        assert page["has_more"] is False and page["object"] == "list"

    @pytest.mark.parametrize(
        "query, ids, more",
        [
            ("?order=asc&limit=2", ["msg_0", "msg_1"], True),
            ("?order=asc&limit=2&after=msg_1", ["msg_2", "msg_3"], True),
            ("?order=asc&limit=2&after=msg_3", ["msg_4"], False),
            ("?order=asc&limit=2&before=msg_3", ["msg_1", "msg_2"], True),
            ("?order=asc&limit=5&before=msg_2", ["msg_0", "msg_1"], False),
            ("?limit=2&after=msg_3", ["msg_2", "msg_1"], True),
            ("?after=msg_nope", [], False),
        ],
    )
    async def test_paging(self, app, query, ids, more):
        page = await self.page(app[ALICE], query)
        assert [i["id"] for i in page["data"]] == ids and page["has_more"] is more

    async def test_another_key_gets_404(self, app):
        reply = await app[BOB].get("/v1/responses/resp_1/input_items")
        assert reply.status_code == 404

    async def test_bad_limit_is_400(self, app):
        reply = await app[ALICE].get("/v1/responses/resp_1/input_items?limit=500")
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "limit"


class TestCancel:
    async def test_a_stored_response_is_not_background(self, app):
        reply = await app[ALICE].post("/v1/responses/resp_1/cancel")
        assert reply.status_code == 400
        assert reply.json()["error"]["code"] == "response_not_cancellable"

    async def test_unknown_is_404(self, app):
        for client, rid in ((app[ALICE], "resp_2"), (app[BOB], "resp_1")):
            reply = await client.post(f"/v1/responses/{rid}/cancel")
            assert reply.status_code == 404
