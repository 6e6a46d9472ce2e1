"""X-Request-Id: honoured when sane (else 400), minted when absent; echoed in the header and
the body's `id`; the engine request ids start with it and carry it as metadata."""

from __future__ import annotations

import uuid

import pytest

from switchyard.preprocessor.edge import Edge
from switchyard.preprocessor.request_ids import MAX_LENGTH, uuid4_hex
from switchyard.preprocessor.stages.tests.fakes import (
    FakeDispatcher,
    FakeRouter,
    chat_body,
    deps,
    done,
    tokens,
)
from switchyard.preprocessor.tests.asgi_client import post

CHAT = "/v1/chat/completions"


def script(req):
    return [tokens(req.request_id, 100, 101), done(req.request_id)]


async def no_app(scope, receive, send):
    raise AssertionError("not a generation request")


@pytest.fixture
def stack(bundle):
    dispatcher = FakeDispatcher(script)
    return Edge(no_app, deps(bundle, FakeRouter([1]), dispatcher), 1 << 20), dispatcher


class TestHonoured:
    async def test_header_body_and_engine_ids(self, stack):
        app, dispatcher = stack
        reply = await post(app, CHAT, chat_body(), {"X-Request-Id": "trace-42:a/b"})
        assert reply.status == 200
        assert reply.headers["x-request-id"] == "trace-42:a/b"
        assert reply.json()["id"] == "trace-42:a/b"
        (sent,) = dispatcher.requests
        assert sent.request_id.startswith("trace-42:a/b-")
        assert sent.http_request_id == "trace-42:a/b"

    async def test_every_stream_chunk_carries_it(self, stack):
        app, _ = stack
        reply = await post(app, CHAT, chat_body(stream=True), {"x-request-id": "s1"})
        assert reply.headers["x-request-id"] == "s1"
        chunks = [line for line in reply.body.split(b"\n\n") if line.startswith(b"data: {")]
        assert chunks and all(b'"id":"s1"' in c for c in chunks)

    async def test_the_same_id_twice_gets_distinct_engine_ids(self, stack):
        """Two clients may send one id; an engine refuses a request id already running."""
        app, dispatcher = stack
        for _ in range(2):
            assert (await post(app, CHAT, chat_body(), {"X-Request-Id": "dup"})).status == 200
        first, second = (r.request_id for r in dispatcher.requests)
        assert first != second and first.startswith("dup-") and second.startswith("dup-")


class TestRefused:
    @pytest.mark.parametrize(
        "value", ["", "has space", "-leading-dash", 'quote"', "x" * (MAX_LENGTH + 1), "é"]
    )
    async def test_a_bad_header_is_a_400_naming_it(self, stack, value):
        app, dispatcher = stack
        reply = await post(app, CHAT, chat_body(), {"X-Request-Id": value})
        assert reply.status == 400
        error = reply.json()["error"]
        assert error["param"] == "X-Request-Id" and "X-Request-Id" in error["message"]
        assert reply.headers["x-request-id"].startswith("chatcmpl-")  # a minted one
        assert dispatcher.requests == []

    async def test_the_longest_accepted(self, stack):
        app, _ = stack
        value = "x" * MAX_LENGTH
        assert (await post(app, CHAT, chat_body(), {"X-Request-Id": value})).status == 200


class TestMinted:
    async def test_without_a_header(self, stack):
        app, dispatcher = stack
        reply = await post(app, CHAT, chat_body())
        minted = reply.headers["x-request-id"]
        assert minted.startswith("chatcmpl-") and reply.json()["id"] == minted
        assert dispatcher.requests[0].request_id == minted
        assert dispatcher.requests[0].http_request_id == minted

    async def test_errors_carry_it_too(self, stack):
        app, _ = stack
        reply = await post(app, CHAT, chat_body(model="nope"), {"X-Request-Id": "e1"})
        assert reply.status == 404 and reply.headers["x-request-id"] == "e1"
        reply = await post(app, "/v1/completions", b"{not json")
        assert reply.status == 400 and reply.headers["x-request-id"].startswith("cmpl-")


def test_minted_ids_are_uuid4_hex():
    for _ in range(200):
        text = uuid4_hex()
        parsed = uuid.UUID(text)
        assert parsed.hex == text and parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert len({uuid4_hex() for _ in range(1000)}) == 1000
