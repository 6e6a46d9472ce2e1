"""The Store contract, run against both real backends (SQLite in a temp folder, a throwaway
PostgreSQL server): responses, conversations and their items, tenant scoping, expiry and
the purge."""

from __future__ import annotations

import orjson
import pytest

from switchyard.preprocessor.storage.interface import Conversation, StoredItem, StoredResponse

NOW = 1_000_000.0


def response(rid: str = "resp_1", tenant: str = "a", **kw: object) -> StoredResponse:
    fields: dict = {
        "id": rid,
        "tenant": tenant,
        "created_at": int(NOW),
        "expires_at": NOW + 100,
        "status": "completed",
        "model": "m",
        "body": orjson.dumps({"id": rid, "output": [{"type": "message"}]}),
        "input_items": orjson.dumps([{"id": "msg_1", "type": "message"}]),
    }
    fields.update(kw)
    return StoredResponse(**fields)


def conversation(cid: str = "conv_1", tenant: str = "a", expires: float | None = None):
    return Conversation(cid, tenant, int(NOW), expires, b'{"topic":"x"}')


def items(*ids: str) -> list[StoredItem]:
    return [StoredItem(i, orjson.dumps({"id": i, "type": "message"})) for i in ids]


class TestResponses:
    async def test_round_trip(self, store):
        kept = response(previous_response_id="resp_0")
        assert await store.put_response(kept)
        assert await store.get_response("a", "resp_1", NOW) == kept

    async def test_another_tenant_sees_nothing(self, store):
        await store.put_response(response())
        assert await store.get_response("b", "resp_1", NOW) is None
        assert not await store.delete_response("b", "resp_1")
        assert await store.get_response("a", "resp_1", NOW) is not None

    async def test_delete(self, store):
        await store.put_response(response())
        assert await store.delete_response("a", "resp_1")
        assert await store.get_response("a", "resp_1", NOW) is None
        assert not await store.delete_response("a", "resp_1")

    async def test_expired_is_not_found_and_purged(self, store):
        await store.put_response(response("resp_old", expires_at=NOW + 10))
        await store.put_response(response("resp_kept", expires_at=None))
        assert await store.get_response("a", "resp_old", NOW + 11) is None
        assert await store.purge(NOW + 11) == 1
        assert await store.get_response("a", "resp_old", NOW) is None  # gone, not hidden
        assert await store.get_response("a", "resp_kept", NOW + 1e9) is not None

    async def test_appended_to_its_conversation(self, store):
        await store.create_conversation(conversation(), items("msg_a"))
        kept = response(conversation_id="conv_1")
        assert await store.put_response(kept, items("msg_b", "msg_c"), touch=NOW + 50)
        page = await store.list_items("a", "conv_1", NOW)
        assert [i.id for i in page.items] == ["msg_a", "msg_b", "msg_c"]
        assert (await store.get_conversation("a", "conv_1", NOW)).expires_at == NOW + 50

    async def test_conversation_of_another_tenant_is_not_appended(self, store):
        await store.create_conversation(conversation(tenant="b"), [])
        assert not await store.put_response(response(conversation_id="conv_1"), items("m"))
        assert (await store.list_items("b", "conv_1", NOW)).items == []


class TestConversations:
    async def test_create_get_update(self, store):
        await store.create_conversation(conversation(), items("msg_1"))
        got = await store.get_conversation("a", "conv_1", NOW)
        assert got == conversation()
        updated = await store.update_conversation("a", "conv_1", b'{"k":"v"}', NOW)
        assert updated is not None and updated.metadata == b'{"k":"v"}'
        assert (await store.get_conversation("a", "conv_1", NOW)).metadata == b'{"k":"v"}'

    async def test_another_tenant_sees_nothing(self, store):
        await store.create_conversation(conversation(), items("msg_1"))
        assert await store.get_conversation("b", "conv_1", NOW) is None
        assert await store.update_conversation("b", "conv_1", b"{}", NOW) is None
        assert not await store.add_items("b", "conv_1", items("msg_2"), NOW)
        assert await store.list_items("b", "conv_1", NOW) is None
        assert await store.get_item("b", "conv_1", "msg_1", NOW) is None
        assert not await store.delete_item("b", "conv_1", "msg_1", NOW)
        assert not await store.delete_conversation("b", "conv_1")
        assert [i.id for i in (await store.list_items("a", "conv_1", NOW)).items] == ["msg_1"]

    async def test_delete_takes_the_items(self, store):
        await store.create_conversation(conversation(), items("msg_1", "msg_2"))
        assert await store.delete_conversation("a", "conv_1")
        assert await store.get_conversation("a", "conv_1", NOW) is None
        # the same id again starts empty: no item of the old one survived
        await store.create_conversation(conversation(), [])
        assert (await store.list_items("a", "conv_1", NOW)).items == []

    async def test_items_get_and_delete(self, store):
        await store.create_conversation(conversation(), items("msg_1", "msg_2"))
        got = await store.get_item("a", "conv_1", "msg_2", NOW)
        assert got is not None and orjson.loads(got.body)["id"] == "msg_2"
        assert await store.get_item("a", "conv_1", "msg_9", NOW) is None
        assert await store.delete_item("a", "conv_1", "msg_1", NOW)
        assert not await store.delete_item("a", "conv_1", "msg_1", NOW)
        assert [i.id for i in (await store.list_items("a", "conv_1", NOW)).items] == ["msg_2"]

    async def test_add_items_keeps_order(self, store):
        await store.create_conversation(conversation(), items("i1"))
        assert await store.add_items("a", "conv_1", items("i2", "i3"), NOW, touch=NOW + 9)
        assert await store.add_items("a", "conv_1", items("i4"), NOW)
        page = await store.list_items("a", "conv_1", NOW)
        assert [i.id for i in page.items] == ["i1", "i2", "i3", "i4"] and not page.has_more
        assert not await store.add_items("a", "conv_nope", items("x"), NOW)

    @pytest.mark.parametrize(
        "descending, after, limit, ids, more",
        [
            (False, None, 2, ["i1", "i2"], True),
            (False, "i2", 2, ["i3", "i4"], True),
            (False, "i4", 2, ["i5"], False),
            (True, None, 2, ["i5", "i4"], True),
            (True, "i4", 10, ["i3", "i2", "i1"], False),
            (True, "i1", 3, [], False),
            (False, "nope", 3, [], False),
        ],
    )
    async def test_pages(self, store, descending, after, limit, ids, more):
        await store.create_conversation(conversation(), items("i1", "i2", "i3", "i4", "i5"))
        page = await store.list_items("a", "conv_1", NOW, after, limit, descending)
        assert [i.id for i in page.items] == ids and page.has_more is more

    async def test_expiry_and_purge(self, store):
        await store.create_conversation(conversation(expires=NOW + 5), items("i1"))
        assert await store.get_conversation("a", "conv_1", NOW + 6) is None
        assert await store.list_items("a", "conv_1", NOW + 6) is None
        assert await store.purge(NOW + 6) == 1
        await store.create_conversation(conversation(), [])
        assert (await store.list_items("a", "conv_1", NOW)).items == []


class TestMigrations:
    async def test_reopening_keeps_the_data(self, store):
        await store.put_response(response())
        await store.close()
        await store.open()  # the schema is current: nothing to migrate, nothing lost
        assert await store.get_response("a", "resp_1", NOW) is not None
