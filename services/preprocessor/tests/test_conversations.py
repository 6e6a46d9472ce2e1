"""/v1/conversations over a real SQLite store, through the edge with two client keys: the
objects' shapes, items in order and in pages, every field and query parameter checked,
another key's conversation not found, a store that stops answering a 503."""

from __future__ import annotations

import sqlite3

import pytest

from .stored_app import KEYS, stored_app

ALICE, BOB = KEYS


@pytest.fixture
async def app(tmp_path):
    async for clients, state in stored_app(tmp_path, max_bytes=64 * 1024, timeout=0.3):
        yield clients, state


@pytest.fixture
def alice(app):
    return app[0][ALICE]


@pytest.fixture
def bob(app):
    return app[0][BOB]


async def new(client, **body):
    reply = await client.post("/v1/conversations", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


class TestConversation:
    async def test_create_get_update_delete(self, alice):
        made = await new(alice, metadata={"topic": "demo"}, items=[user("hi")])
        assert made["object"] == "conversation" and made["id"].startswith("conv_")
        assert made["metadata"] == {"topic": "demo"} and isinstance(made["created_at"], int)
        got = await alice.get(f"/v1/conversations/{made['id']}")
        assert got.json() == made
        updated = await alice.post(f"/v1/conversations/{made['id']}", json={"metadata": {"a": "b"}})
        assert updated.json() == {**made, "metadata": {"a": "b"}}
        deleted = await alice.delete(f"/v1/conversations/{made['id']}")
        assert deleted.json() == {
            "id": made["id"],
            "object": "conversation.deleted",
            "deleted": True,
        }
        gone = await alice.get(f"/v1/conversations/{made['id']}")
        assert gone.status_code == 404
        assert gone.json()["error"] == {
            "message": f"Conversation with id '{made['id']}' not found.",
            "type": "invalid_request_error",
            "param": None,
            "code": "conversation_not_found",
        }

    async def test_empty_body_makes_an_empty_conversation(self, alice):
        made = await alice.post("/v1/conversations")
        assert made.status_code == 200 and made.json()["metadata"] == {}
        items = await alice.get(f"/v1/conversations/{made.json()['id']}/items")
        assert items.json() == {
            "object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False
        }  # fmt: skip

    @pytest.mark.parametrize(
        "body, param",
        [
            ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
            ({"metadata": {"k": "v" * 513}}, "metadata"),
            ({"items": [user("x")] * 21}, "items"),
            ({"items": [{"type": "message", "role": "user", "content": [
                {"type": "input_image", "image_url": "http://x"}]}]}, "items[0].content[0].type"),
            ({"items": [{"type": "web_search_call"}]}, "items[0].type"),
            ({"title": "x"}, "title"),
        ],
    )  # fmt: skip
    async def test_bad_fields_are_400_naming_them(self, alice, body, param):
        reply = await alice.post("/v1/conversations", json=body)
        assert reply.status_code == 400
        assert reply.json()["error"]["param"] == param

    async def test_a_body_past_the_limit_is_413(self, alice):
        reply = await alice.post("/v1/conversations", json={"items": [user("x" * 70000)]})
        assert reply.status_code == 413

    async def test_update_needs_metadata(self, alice):
        made = await new(alice)
        reply = await alice.post(f"/v1/conversations/{made['id']}", json={})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "metadata"


class TestItems:
    async def test_shapes_ids_and_order(self, alice):
        made = await new(alice, items=[user("one")])
        added = await alice.post(
            f"/v1/conversations/{made['id']}/items",
            json={
                "items": [
                    {"role": "assistant", "content": "two"},
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "42"},
                ]
            },
        )
        body = added.json()
        assert body["object"] == "list" and body["has_more"] is False
        message, call, output = body["data"]
        assert message["id"].startswith("msg_") and message["status"] == "completed"
        assert message["content"] == [
            {"type": "output_text", "text": "two", "annotations": [], "logprobs": []}
        ]
        assert call["id"].startswith("fc_") and call["call_id"] == "c1"
        assert output["id"].startswith("fco_") and output["output"] == "42"
        assert (body["first_id"], body["last_id"]) == (message["id"], output["id"])
        listed = (await alice.get(f"/v1/conversations/{made['id']}/items?order=asc")).json()
        first = listed["data"][0]
        assert first["content"] == [{"type": "input_text", "text": "one"}]
        assert [i["id"] for i in listed["data"][1:]] == [i["id"] for i in body["data"]]
        newest_first = (await alice.get(f"/v1/conversations/{made['id']}/items")).json()
        assert newest_first["data"] == listed["data"][::-1]  # desc by default
        one = await alice.get(f"/v1/conversations/{made['id']}/items/{call['id']}")
        assert one.json() == call

    async def test_pages(self, alice):
        made = await new(alice, items=[user(str(i)) for i in range(5)])
        path = f"/v1/conversations/{made['id']}/items"
        seen, after = [], None
        while True:
            query = "?order=asc&limit=2" + (f"&after={after}" if after else "")
            page = (await alice.get(path + query)).json()
            seen += [i["content"][0]["text"] for i in page["data"]]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert seen == ["0", "1", "2", "3", "4"]

    @pytest.mark.parametrize(
        "query, param",
        [
            ("limit=0", "limit"),
            ("limit=101", "limit"),
            ("limit=x", "limit"),
            ("order=up", "order"),
            ("before=msg_1", "before"),  # the Conversations API pages forward only
            ("include=message.output_text.logprobs", "include"),
        ],
    )
    async def test_bad_query_is_400_naming_it(self, alice, query, param):
        made = await new(alice)
        reply = await alice.get(f"/v1/conversations/{made['id']}/items?{query}")
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param

    async def test_delete_item_answers_with_the_conversation(self, alice):
        made = await new(alice, items=[user("a"), user("b")])
        path = f"/v1/conversations/{made['id']}/items"
        first = (await alice.get(path + "?order=asc")).json()["data"][0]
        reply = await alice.delete(f"{path}/{first['id']}")
        assert reply.json() == made
        assert [i["content"][0]["text"] for i in (await alice.get(path)).json()["data"]] == ["b"]
        again = await alice.delete(f"{path}/{first['id']}")
        assert again.status_code == 404 and again.json()["error"]["code"] == "item_not_found"

    async def test_items_of_a_missing_conversation(self, alice):
        for method, path in [
            ("GET", "/v1/conversations/conv_x/items"),
            ("GET", "/v1/conversations/conv_x/items/msg_1"),
            ("DELETE", "/v1/conversations/conv_x/items/msg_1"),
        ]:
            reply = await alice.request(method, path)
            assert reply.json()["error"]["code"] == "conversation_not_found"
        reply = await alice.post("/v1/conversations/conv_x/items", json={"items": [user("a")]})
        assert reply.status_code == 404


class TestAnotherKey:
    async def test_sees_nothing_of_it(self, alice, bob):
        made = await new(alice, items=[user("secret")])
        cid = made["id"]
        item = (await alice.get(f"/v1/conversations/{cid}/items")).json()["data"][0]["id"]
        for method, path, body in [
            ("GET", f"/v1/conversations/{cid}", None),
            ("POST", f"/v1/conversations/{cid}", {"metadata": {}}),
            ("DELETE", f"/v1/conversations/{cid}", None),
            ("GET", f"/v1/conversations/{cid}/items", None),
            ("POST", f"/v1/conversations/{cid}/items", {"items": [user("x")]}),
            ("GET", f"/v1/conversations/{cid}/items/{item}", None),
            ("DELETE", f"/v1/conversations/{cid}/items/{item}", None),
        ]:
            reply = await bob.request(method, path, json=body)
            assert reply.status_code == 404, (method, path)
            assert reply.json()["error"]["code"] == "conversation_not_found"
        items = (await alice.get(f"/v1/conversations/{cid}/items")).json()["data"]
        assert [i["content"][0]["text"] for i in items] == ["secret"]
        assert (await alice.get(f"/v1/conversations/{cid}")).json() == made


class TestUnavailable:
    async def test_a_locked_database_is_503(self, alice, app, tmp_path):
        made = await new(alice)
        other = sqlite3.connect(app[1].config.store.sqlite_path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            reply = await alice.post("/v1/conversations", json={})
            assert reply.status_code == 503
            assert reply.json()["error"]["code"] == "store_unavailable"
            assert "locked" not in reply.text  # the cause is logged, not sent
        finally:
            other.rollback()
            other.close()
        storage = app[1].storage
        for _ in range(200):  # the probe (once a second) finds it answering again
            if storage.up:
                break
            await __import__("asyncio").sleep(0.05)
        assert (await alice.get(f"/v1/conversations/{made['id']}")).status_code == 200
