"""FastPath: the generation endpoints as plain ASGI (fake receive/send, a stand-in answer)."""

import asyncio

import orjson
import pytest
from starlette.responses import Response

from switchyard.preprocessor import fast_path
from switchyard.preprocessor.app import EventStream
from switchyard.preprocessor.fast_path import FastPath


def http(path: str, method: str = "POST") -> dict:
    return {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}


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


@pytest.fixture
def answers(monkeypatch):
    """What `generation` sees and returns."""
    seen: list[tuple[bytes, bool]] = []
    queue: list[object] = []

    async def generation(state, body, chat, started, session_id=None):
        seen.append((body, chat))
        return queue.pop(0)

    monkeypatch.setattr(fast_path, "generation", generation)
    return seen, queue


async def other_app(scope, receive, send):
    await Response(b"fastapi", 200)(scope, receive, send)


async def test_generation_paths_get_the_whole_body(answers):
    seen, queue = answers
    queue += [Response(b"{}", 200), Response(b"{}", 200)]
    app = FastPath(other_app, None, max_body_bytes=100)
    await app(http("/v1/chat/completions"), Client(b'{"a":', b"1}").receive, Client().send)
    await app(http("/v1/completions"), Client(b"{}").receive, Client().send)
    assert seen == [(b'{"a":1}', True), (b"{}", False)]


async def test_other_requests_go_to_fastapi(answers):
    app = FastPath(other_app, None, max_body_bytes=100)
    for scope in (
        http("/v1/models", "GET"),
        http("/debug/route"),
        http("/v1/chat/completions", "GET"),
    ):
        client = Client()
        await app(scope, client.receive, client.send)
        assert client.body == b"fastapi"
    assert answers[0] == []


async def test_a_body_over_the_limit_is_413(answers):
    app = FastPath(other_app, None, max_body_bytes=10)
    client = Client(b"x" * 8, b"x" * 8)
    await app(http("/v1/chat/completions"), client.receive, client.send)
    assert client.sent[0]["status"] == 413
    assert orjson.loads(client.body)["error"]["code"] == "request_too_large"
    assert answers[0] == []


async def test_a_client_gone_before_its_body_gets_nothing(answers):
    app = FastPath(other_app, None, max_body_bytes=10)
    client = Client()
    client.chunks = []
    client.leave()
    await app(http("/v1/chat/completions"), client.receive, client.send)
    assert client.sent == [] and answers[0] == []


async def test_a_stream_is_written_frame_by_frame(answers):
    async def frames():
        yield b"data: 1\n\n"
        yield b"data: [DONE]\n\n"

    answers[1].append(EventStream(frames()))
    client = Client(b"{}")
    await FastPath(other_app, None, 100)(http("/v1/chat/completions"), client.receive, client.send)
    start = client.sent[0]
    assert start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert [m["body"] for m in client.sent[1:]] == [b"data: 1\n\n", b"data: [DONE]\n\n", b""]
    assert client.sent[-1]["more_body"] is False


async def test_a_client_leaving_mid_stream_closes_the_stream(answers):
    closed = asyncio.Event()
    first_sent = asyncio.Event()

    async def frames():
        try:
            yield b"data: 1\n\n"
            first_sent.set()
            await asyncio.sleep(60)  # waiting for the engine's next token
            yield b"data: 2\n\n"
        finally:
            closed.set()  # the pipeline cancels the generation here

    answers[1].append(EventStream(frames()))
    client = Client(b"{}")
    serving = asyncio.create_task(
        FastPath(other_app, None, 100)(http("/v1/chat/completions"), client.receive, client.send)
    )
    await asyncio.wait_for(first_sent.wait(), 5)
    client.leave()
    await asyncio.wait_for(serving, 5)  # returns normally: the client is gone, nothing to do
    assert closed.is_set()
    assert client.body == b"data: 1\n\n"


async def test_server_shutdown_still_cancels_the_stream(answers):
    async def frames():
        yield b"data: 1\n\n"
        await asyncio.sleep(60)

    answers[1].append(EventStream(frames()))
    client = Client(b"{}")
    serving = asyncio.create_task(
        FastPath(other_app, None, 100)(http("/v1/chat/completions"), client.receive, client.send)
    )
    while len(client.sent) < 2:
        await asyncio.sleep(0.001)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
