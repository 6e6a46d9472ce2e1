"""Stored responses and conversations end to end with the openai SDK, unmodified, through
the real stack on both engine protocols (issue 36): store, retrieve, chain with
previous_response_id, input_items with paging, delete, conversations with items; another
key sees none of it; `store: false` leaves nothing behind; no stored content in the logs.

That a stored context reaches the model through the chat template as it would have seen it
is checked by its prompt: a chained turn's input tokens equal those of the same items sent
statelessly (`store: false`).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import openai
import pytest
from e2e_stack import running_stack

ALICE, BOB = "sk-alice-e2e", "sk-bob-e2e"
MODEL = "deepseek-mock"


def marker() -> str:
    """Text that can be searched for on disk and in logs."""
    return f"zq{uuid.uuid4().hex}zq"


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def stack(request, tmp_path_factory):
    data = tmp_path_factory.mktemp(f"stored-{request.param}")
    keys = ["--api-key", ALICE, "--api-key", BOB]
    with running_stack("--mock-engines", request.param, "--data-dir", str(data), *keys) as s:
        s.data = data
        s.alice = openai.OpenAI(base_url=s.base_url + "/v1", api_key=ALICE, max_retries=0)
        s.bob = openai.OpenAI(base_url=s.base_url + "/v1", api_key=BOB, max_retries=0)
        s.markers = []
        try:
            yield s
        finally:
            s.alice.close()
            s.bob.close()
            log = s.log()
            leaked = [m for m in s.markers if m in log]
            assert not leaked, "stored content reached the logs"


def said(s, text: str | None = None) -> str:
    text = text or marker()
    s.markers.append(text)
    return text


def on_disk(folder: Path, text: str) -> bool:
    return any(text.encode() in p.read_bytes() for p in folder.rglob("*") if p.is_file())


def ask(client: openai.OpenAI, **kw):
    return client.responses.create(model=MODEL, max_output_tokens=8, temperature=0, **kw)


class TestStore:
    def test_kept_by_default_and_retrieved(self, stack):
        reply = ask(stack.alice, input=said(stack))
        assert reply.store is True and reply.status in ("completed", "incomplete")
        got = stack.alice.responses.retrieve(reply.id)
        assert got.model_dump() == reply.model_dump()

    def test_streamed_and_kept_before_its_last_event(self, stack):
        with ask(stack.alice, input=said(stack), stream=True) as events:
            final = [e for e in events][-1].response
        assert final.store is True
        # chained at once: the store had it before response.completed went out
        follow = ask(stack.alice, input=said(stack), previous_response_id=final.id)
        assert follow.previous_response_id == final.id

    def test_store_false_leaves_nothing_behind(self, stack):
        text = said(stack)
        reply = ask(stack.alice, input=text, store=False)
        assert reply.store is False
        with pytest.raises(openai.NotFoundError):
            stack.alice.responses.retrieve(reply.id)
        assert not on_disk(stack.data, text)
        kept = said(stack)
        ask(stack.alice, input=kept)
        assert on_disk(stack.data, kept)  # the check can see what is stored

    def test_delete(self, stack):
        text = said(stack)
        reply = ask(stack.alice, input=text)
        stack.alice.responses.delete(reply.id)
        with pytest.raises(openai.NotFoundError) as err:
            stack.alice.responses.retrieve(reply.id)
        assert err.value.body["code"] == "response_not_found"
        with pytest.raises(openai.BadRequestError) as err:
            ask(stack.alice, input="next", previous_response_id=reply.id)
        assert err.value.body["code"] == "previous_response_not_found"
        assert not on_disk(stack.data, text)  # deleted, not hidden


class TestChain:
    def test_context_through_the_template_and_input_items(self, stack):
        first = ask(stack.alice, input=said(stack), instructions="Answer in one word.")
        second = ask(stack.alice, input=said(stack), previous_response_id=first.id)
        assert second.previous_response_id == first.id and second.instructions is None
        items = list(stack.alice.responses.input_items.list(second.id, order="asc", limit=1))
        assert [i.type for i in items] == ["message", "message", "message"]
        assert [i.role for i in items] == ["user", "assistant", "user"]
        assert items[1].content[0].text == first.output_text
        # the same items sent statelessly make the same prompt (no instructions carried)
        alone = ask(stack.alice, input=[i.model_dump(exclude_none=True) for i in items],
                    store=False)  # fmt: skip
        assert second.usage.input_tokens == alone.usage.input_tokens
        newest = stack.alice.responses.input_items.list(second.id, limit=2)
        assert [i.id for i in newest.data] == [items[2].id, items[1].id] and newest.has_more

    def test_a_chain_of_three(self, stack):
        reply = ask(stack.alice, input=said(stack))
        for _ in range(2):
            reply = ask(stack.alice, input=said(stack), previous_response_id=reply.id)
        items = list(stack.alice.responses.input_items.list(reply.id, order="asc"))
        assert [i.role for i in items] == ["user", "assistant"] * 2 + ["user"]

    def test_unknown_previous_response_is_openais_400(self, stack):
        with pytest.raises(openai.BadRequestError) as err:
            ask(stack.alice, input="x", previous_response_id="resp_nope")
        assert err.value.body == {
            "message": "Previous response with id 'resp_nope' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }


class TestConversations:
    def test_each_turn_appends_its_items(self, stack):
        conv = stack.alice.conversations.create(metadata={"topic": "e2e"})
        first = ask(stack.alice, input=said(stack), conversation=conv.id)
        second = ask(stack.alice, input=said(stack), conversation={"id": conv.id})
        assert second.conversation.id == conv.id
        items = list(stack.alice.conversations.items.list(conv.id, order="asc"))
        assert [i.role for i in items] == ["user", "assistant", "user", "assistant"]
        assert items[1].content[0].text == first.output_text
        alone = ask(stack.alice, input=[i.model_dump(exclude_none=True) for i in items[:3]],
                    store=False)  # fmt: skip
        assert second.usage.input_tokens == alone.usage.input_tokens

    def test_items_added_by_hand_are_context(self, stack):
        conv = stack.alice.conversations.create(
            items=[{"type": "message", "role": "user", "content": said(stack)}]
        )
        stack.alice.conversations.items.create(
            conv.id, items=[{"type": "message", "role": "assistant", "content": said(stack)}]
        )
        reply = ask(stack.alice, input=said(stack), conversation=conv.id)
        items = list(stack.alice.conversations.items.list(conv.id, order="asc"))
        assert len(items) == 4 and items[-1].content[0].text == reply.output_text
        stack.alice.conversations.items.delete(items[0].id, conversation_id=conv.id)
        assert len(list(stack.alice.conversations.items.list(conv.id))) == 3
        deleted = stack.alice.conversations.delete(conv.id)
        assert deleted.deleted is True
        with pytest.raises(openai.NotFoundError):
            ask(stack.alice, input="x", conversation=conv.id)

    def test_conversation_with_previous_response_is_400(self, stack):
        conv = stack.alice.conversations.create()
        first = ask(stack.alice, input="x")
        with pytest.raises(openai.BadRequestError) as err:
            ask(stack.alice, input="y", conversation=conv.id, previous_response_id=first.id)
        assert err.value.body["param"] == "conversation"


class TestAnotherKey:
    def test_sees_and_continues_nothing(self, stack):
        reply = ask(stack.alice, input=said(stack))
        conv = stack.alice.conversations.create()
        for call in (
            lambda: stack.bob.responses.retrieve(reply.id),
            lambda: stack.bob.responses.delete(reply.id),
            lambda: stack.bob.responses.input_items.list(reply.id),
            lambda: stack.bob.conversations.retrieve(conv.id),
            lambda: stack.bob.conversations.items.list(conv.id),
            lambda: ask(stack.bob, input="x", conversation=conv.id),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        with pytest.raises(openai.BadRequestError) as err:
            ask(stack.bob, input="x", previous_response_id=reply.id)
        assert err.value.body["code"] == "previous_response_not_found"
        assert stack.alice.responses.retrieve(reply.id).id == reply.id  # untouched
