"""The HTTP edge as plain ASGI (fake receive/send): bodies, limits, and clients that leave."""

import asyncio

import orjson
import pytest
from starlette.responses import Response

from switchyard.preprocessor import edge
from switchyard.preprocessor.auth import Access, KeyRing
from switchyard.preprocessor.edge import CLIENT_GONE, Edge
from switchyard.preprocessor.metrics import PreprocessorMetrics


def http(path: str, method: str = "POST", headers: list | None = None) -> dict:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers or [],
        "query_string": b"",
    }


class Client:
    """receive() hands out the body (in chunks), then blocks until `leave()`."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks) or [b""]
        self.gone = asyncio.Event()
        self.sent: list[dict] = []

    def leave(self) -> None:
        self.gone.set()

    async def receive(self) -> dict:
        if self.chunks:
            body = self.chunks.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


class Deps:
    def __init__(self) -> None:
        self.metrics = PreprocessorMetrics()
        self.tracing = None
        self.instances = dict


@pytest.fixture
def served(monkeypatch):
    """What `serve` sees; `behaviour` decides what it does with the HttpOut."""
    seen: list[tuple[str, bytes]] = []
    state = {"behaviour": None, "sessions": []}

    async def serve(ctx, body):
        seen.append((ctx.inp.endpoint, body))
        state["sessions"].append(ctx.inp.session_id)
        return await state["behaviour"](ctx.inp.http)

    monkeypatch.setattr(edge, "serve", serve)
    return seen, state


async def other_app(scope, receive, send):
    await Response(b"fastapi", 200)(scope, receive, send)


async def answer_json(out):
    await out.respond(200, b"{}")
    return 200


async def test_generation_paths_get_the_whole_body(served):
    seen, state = served
    state["behaviour"] = answer_json
    app = Edge(other_app, Deps(), max_body_bytes=100)
    await app(http("/v1/chat/completions"), Client(b'{"a":', b"1}").receive, Client().send)
    await app(http("/v1/completions"), Client(b"{}").receive, Client().send)
    assert seen == [("chat_completions", b'{"a":1}'), ("completions", b"{}")]


async def test_the_session_header_reaches_the_stages(served):
    _, state = served
    state["behaviour"] = answer_json
    app = Edge(other_app, Deps(), max_body_bytes=100)
    headers = [(b"content-type", b"application/json"), (b"x-session-id", b"conversation-7")]
    await app(http("/v1/chat/completions", headers=headers), Client(b"{}").receive, Client().send)
    await app(http("/v1/completions"), Client(b"{}").receive, Client().send)
    assert state["sessions"] == ["conversation-7", None]


async def test_other_requests_go_to_fastapi(served):
    app = Edge(other_app, Deps(), max_body_bytes=100)
    for scope in (
        http("/v1/models", "GET"),
        http("/debug/route"),
        http("/v1/responses/resp_1", "GET"),  # a stored response: app.py's
        http("/v1/chat/completions/", "GET"),  # not the collection path itself
    ):
        client = Client()
        await app(scope, client.receive, client.send)
        assert client.body == b"fastapi"
    assert served[0] == []


class TestOtherMethodsOnGenerationPaths:
    """Regression: GET/PUT/DELETE on the generation paths fell through to FastAPI, which has no
    route there and said 404; a wrong method on a path that exists is 405, as POST /v1/models
    is."""

    @pytest.mark.parametrize("path", list(edge.GENERATION_PATHS))
    @pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
    async def test_405_with_allow_post(self, served, method, path):
        app = Edge(other_app, Deps(), max_body_bytes=100)
        client = Client()
        await app(http(path, method), client.receive, client.send)
        start = client.sent[0]
        assert start["status"] == 405
        assert (b"allow", b"POST") in start["headers"]
        body = orjson.loads(client.body)
        error = body["error"]
        if path in edge.ANTHROPIC_PATHS:  # Anthropic's shape: no code
            assert body["type"] == "error" and set(error) == {"type", "message"}
        else:
            assert error["code"] == "method_not_allowed"
        assert error["type"] == "invalid_request_error"
        assert method in error["message"] and path in error["message"]
        assert served[0] == []

    async def test_the_key_is_checked_first(self, served):
        access = Access(KeyRing(["sk-right"]))
        app = Edge(other_app, Deps(), max_body_bytes=100, access=access)
        client = Client()
        await app(http("/v1/chat/completions", "GET"), client.receive, client.send)
        assert client.sent[0]["status"] == 401


async def test_a_body_over_the_limit_is_413(served):
    app = Edge(other_app, Deps(), max_body_bytes=10)
    client = Client(b"x" * 8, b"x" * 8)
    await app(http("/v1/chat/completions"), client.receive, client.send)
    assert client.sent[0]["status"] == 413
    assert orjson.loads(client.body)["error"]["code"] == "request_too_large"
    assert served[0] == []


@pytest.mark.parametrize("encoding", [b"gzip", b"br", b"deflate, gzip"])
async def test_a_compressed_body_is_415(served, encoding):
    app = Edge(other_app, Deps(), max_body_bytes=100)
    client = Client(b"\x1f\x8b\x08")
    headers = [(b"content-encoding", encoding)]
    await app(http("/v1/chat/completions", headers=headers), client.receive, client.send)
    assert client.sent[0]["status"] == 415
    assert (b"accept-encoding", b"identity") in client.sent[0]["headers"]
    assert orjson.loads(client.body)["error"]["code"] == "unsupported_content_encoding"
    assert served[0] == []


async def test_an_identity_encoding_is_read(served):
    seen, state = served
    state["behaviour"] = answer_json
    app = Edge(other_app, Deps(), max_body_bytes=100)
    headers = [(b"content-encoding", b"identity")]
    await app(http("/v1/completions", headers=headers), Client(b"{}").receive, Client().send)
    assert seen == [("completions", b"{}")]


async def test_a_client_gone_before_its_body_gets_nothing(served):
    app = Edge(other_app, Deps(), max_body_bytes=10)
    client = Client()
    client.chunks = []
    client.leave()
    await app(http("/v1/chat/completions"), client.receive, client.send)
    assert client.sent == [] and served[0] == []


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_client_leaving_cancels_the_answer(served, streaming):
    """Regression guard: a non-streaming request whose client left kept its engine request
    running to the end (issue 14); streaming or not, the answer is now cancelled."""
    _, state = served
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(out):
        if streaming:
            await out.start_stream()
            await out.write(b"data: 1\n\n")
        started.set()
        try:
            await asyncio.sleep(60)  # waiting for the engine
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 200

    state["behaviour"] = slow
    deps = Deps()
    client = Client(b"{}")
    serving = asyncio.create_task(
        Edge(other_app, deps, 100)(http("/v1/chat/completions"), client.receive, client.send)
    )
    await asyncio.wait_for(started.wait(), 5)
    client.leave()
    await asyncio.wait_for(serving, 5)  # returns normally: the client is gone
    assert cancelled.is_set()
    counted = deps.metrics.requests.by_labels[("chat_completions", "", str(CLIENT_GONE))]
    assert counted >= 1


async def test_the_end_of_a_complete_answer_is_not_a_client_leaving(served):
    """uvicorn's receive() says http.disconnect once the response is complete: cleanup that
    still runs after the last byte must not be cancelled."""
    _, state = served
    finished = asyncio.Event()

    async def answer_then_clean_up(out):
        await out.respond(200, b"{}")
        await asyncio.sleep(0.05)  # e.g. telling the router the request ended
        finished.set()
        return 200

    state["behaviour"] = answer_then_clean_up
    client = Client(b"{}")
    client.leave()  # receive() answers disconnect as soon as the body is read
    await Edge(other_app, Deps(), 100)(http("/v1/chat/completions"), client.receive, client.send)
    assert finished.is_set()


async def test_server_shutdown_still_cancels_the_answer(served):
    _, state = served

    async def forever(out):
        await out.start_stream()
        await out.write(b"data: 1\n\n")
        await asyncio.sleep(60)
        return 200

    state["behaviour"] = forever
    client = Client(b"{}")
    serving = asyncio.create_task(
        Edge(other_app, Deps(), 100)(http("/v1/chat/completions"), client.receive, client.send)
    )
    while len(client.sent) < 2:
        await asyncio.sleep(0.001)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
