"""stages/stored over a real SQLite store and fake router/dispatcher clients: a kept
response is in the store before its last frame goes out, a chained turn's prompt is the one
the same items sent statelessly make (the earlier instructions not carried), a response that
fails mid-generation is answered and kept as failed (streamed: once tokens came; not
streamed: once an engine took it), one that fails before is an HTTP error kept nowhere, one
cut by max_output_tokens is kept as incomplete, a response over the size cap is answered
unstored, `store: false` writes nothing, and a store that is down is a 503 before any engine
work (or, with --store-unavailable serve, an answer that says it was not kept)."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from typing import Any

import orjson
import pytest

from switchyard.common import errors
from switchyard.preprocessor.stages import endpoints
from switchyard.preprocessor.stages.context import RESPONSES
from switchyard.preprocessor.stages.tests.fakes import (
    MODEL,
    FakeDispatcher,
    FakeHttp,
    FakeRouter,
    deps,
    done,
    failed,
    serve,
    tokens,
)
from switchyard.preprocessor.storage.config import StoreConfig
from switchyard.preprocessor.storage.service import Storage
from switchyard.preprocessor.storage.sqlite import SqliteStore

pytestmark = pytest.mark.timeout(60)
TENANT = ""  # serve() without an exchange: the open server's tenant


def body(**fields: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "input": "hi", "max_output_tokens": 16, **fields})


def answering(bundle, text: str = "Hello there"):
    ids = bundle.encode(text)
    return lambda r: [tokens(r.request_id, *ids), done(r.request_id, "stop")]


@pytest.fixture
async def storage(tmp_path):
    config = StoreConfig(data_dir=tmp_path, timeout=0.5)
    kept = Storage(SqliteStore(config.sqlite_path, 0.5), config)
    await kept.start()
    yield kept
    await kept.close()


def stack(bundle, storage, script=None):
    dispatcher = FakeDispatcher(script or answering(bundle))
    return dataclasses.replace(
        deps(bundle, FakeRouter([1]), dispatcher), storage=storage
    ), dispatcher


async def run(d, raw: bytes, http: FakeHttp | None = None) -> tuple[int, FakeHttp]:
    http = http or FakeHttp()
    return await serve(d, RESPONSES, raw, http), http


def final(http: FakeHttp) -> dict[str, Any]:
    return orjson.loads(http.last.rsplit(b"data: ", 1)[1])["response"]


class TestKept:
    async def test_in_the_store_before_the_last_frame(self, bundle, storage):
        d, _ = stack(bundle, storage)
        seen: list[bool] = []

        class Watching(FakeHttp):
            async def end_stream(self, data: bytes = b"") -> None:
                rid = orjson.loads(data.split(b"data: ", 1)[1])["response"]["id"]
                seen.append(await storage.get_response(TENANT, rid) is not None)
                await super().end_stream(data)

        status, http = await run(d, body(stream=True), Watching())
        assert status == 200 and seen == [True]
        assert final(http)["store"] is True

    async def test_whole_answer_is_the_stored_bytes(self, bundle, storage):
        d, _ = stack(bundle, storage)
        status, http = await run(d, body())
        answer = http.json()
        assert status == 200 and answer["store"] is True
        kept = await storage.get_response(TENANT, answer["id"])
        assert kept is not None and orjson.loads(kept.body) == answer
        assert [i["role"] for i in orjson.loads(kept.input_items)] == ["user"]

    async def test_a_clients_request_id_is_not_the_stored_id(self, bundle, storage):
        """Stored ids must be unique across keys: X-Request-Id stays the header's only."""
        d, _ = stack(bundle, storage)
        http = FakeHttp()
        ctx = endpoints.new_request(
            d, RESPONSES, http, request_id="resp_mine", engine_prefix="resp_mine-1a2b"
        )
        assert await endpoints.serve(ctx, body()) == 200
        rid = http.json()["id"]
        assert rid != "resp_mine" and rid.startswith("resp_")
        assert await storage.get_response(TENANT, rid) is not None

    async def test_store_false_writes_nothing(self, bundle, storage, tmp_path):
        d, _ = stack(bundle, storage)
        _, http = await run(d, body(store=False, input="unmistakable-4c1d"))
        assert http.json()["store"] is False
        assert await storage.get_response(TENANT, http.json()["id"]) is None
        conn = sqlite3.connect(storage.config.sqlite_path)
        assert conn.execute("SELECT count(*) FROM responses").fetchone()[0] == 0
        conn.close()

    async def test_a_failed_stream_is_kept_as_failed(self, bundle, storage):
        d, dispatcher = stack(
            bundle, storage, lambda r: [tokens(r.request_id, *bundle.encode("Hi"))]
        )
        http = FakeHttp()
        serving = asyncio.create_task(serve(d, RESPONSES, body(stream=True), http))
        while not http.writes:
            await asyncio.sleep(0.01)
        rid = dispatcher.requests[0].request_id
        dispatcher.streams[0].queue.put_nowait(failed(rid, 1, errors.ENGINE_ERROR))
        assert await serving == 200
        sent = final(http)
        kept = await storage.get_response(TENANT, sent["id"])
        assert kept is not None and kept.status == "failed"
        assert orjson.loads(kept.body)["error"]["code"] == "server_error"

    async def test_a_failed_stream_keeps_its_output_so_far(self, bundle, storage):
        d, dispatcher = stack(
            bundle, storage, lambda r: [tokens(r.request_id, *bundle.encode("Hi there"))]
        )
        http = FakeHttp()
        serving = asyncio.create_task(serve(d, RESPONSES, body(stream=True), http))
        while not http.writes:
            await asyncio.sleep(0.01)
        dispatcher.streams[0].queue.put_nowait(
            failed(dispatcher.requests[0].request_id, 1, errors.ENGINE_ERROR)
        )
        assert await serving == 200
        kept = await storage.get_response(TENANT, final(http)["id"])
        assert kept is not None
        stored = orjson.loads(kept.body)
        assert stored == final(http)
        (item,) = stored["output"]  # the message it was writing, closed as incomplete
        assert item["status"] == "incomplete" and item["content"][0]["text"] == "Hi there"
        assert stored["usage"]["output_tokens"] == len(bundle.encode("Hi there"))

    async def test_a_failure_after_tokens_not_streamed_is_a_failed_response(self, bundle, storage):
        """Regression (issue 36): a `store: true` response that failed mid-generation
        without streaming was answered with an HTTP error and kept nowhere."""
        ids = bundle.encode("Hi there")
        d, dispatcher = stack(
            bundle,
            storage,
            lambda r: [tokens(r.request_id, *ids), failed(r.request_id, 1, errors.ENGINE_ERROR)],
        )
        status, http = await run(d, body())
        sent = http.json()
        assert status == 200 and sent["status"] == "failed" and sent["store"] is True
        assert sent["error"]["code"] == "server_error" and sent["incomplete_details"] is None
        assert sent["output"][0]["status"] == "incomplete"
        assert sent["output"][0]["content"][0]["text"] == "Hi there"
        assert sent["usage"]["output_tokens"] == len(ids)
        kept = await storage.get_response(TENANT, sent["id"])
        assert kept is not None and kept.status == "failed"
        assert orjson.loads(kept.body) == sent

    async def test_an_engine_failure_not_streamed_before_any_token_is_failed(self, bundle, storage):
        """Not streamed, the engine answers once at the end: a response it took and failed
        existed, with no output."""
        d, _ = stack(bundle, storage, lambda r: [failed(r.request_id, 1, errors.ENGINE_ERROR)])
        status, http = await run(d, body())
        sent = http.json()
        assert status == 200 and sent["status"] == "failed"
        assert sent["usage"]["output_tokens"] == 0
        kept = await storage.get_response(TENANT, sent["id"])
        assert kept is not None and kept.status == "failed"

    @pytest.mark.parametrize(
        "stream, script, router, status",
        [
            (True, [errors.ENGINE_ERROR], [1], 500),  # streamed: no token, no response
            (False, [errors.BAD_REQUEST], [1], 400),  # the engine refused the request
            (False, [], [], 503),  # no engine took it
            (True, [], [], 503),
        ],
    )
    async def test_an_error_before_the_response_existed_is_kept_nowhere(
        self, bundle, storage, stream, script, router, status
    ):
        d, _ = stack(
            bundle,
            storage,
            lambda r: [failed(r.request_id, 1, kind, engine_fault=False) for kind in script],
        )
        d = dataclasses.replace(d, router=FakeRouter(router))
        got, http = await run(d, body(stream=stream))
        assert got == status and http.status == status
        conn = sqlite3.connect(storage.config.sqlite_path)
        assert conn.execute("SELECT count(*) FROM responses").fetchone()[0] == 0
        conn.close()

    @pytest.mark.parametrize("stream", [False, True])
    async def test_cut_by_max_output_tokens_is_kept_incomplete(self, bundle, storage, stream):
        ids = bundle.encode("Hi there")
        d, _ = stack(bundle, storage, lambda r: [tokens(r.request_id, *ids), done(r.request_id)])
        _, http = await run(d, body(stream=stream, max_output_tokens=len(ids)))
        sent = final(http) if stream else http.json()
        assert sent["status"] == "incomplete"
        kept = await storage.get_response(TENANT, sent["id"])
        assert kept is not None and kept.status == "incomplete"
        stored = orjson.loads(kept.body)
        assert stored["incomplete_details"] == {"reason": "max_output_tokens"}
        assert stored["output"][0]["content"][0]["text"] == "Hi there"

    async def test_over_the_size_cap(self, bundle, tmp_path):
        """Input items over the cap: 400 up front (unless store: false); an output that takes
        the response over it: answered, not kept."""
        config = StoreConfig(data_dir=tmp_path, max_bytes=600)
        small = Storage(SqliteStore(config.sqlite_path), config)
        await small.start()
        try:
            d, dispatcher = stack(bundle, small)
            status, http = await run(d, body(input="x" * 700))
            assert status == 400 and http.json()["error"]["param"] == "input"
            assert dispatcher.requests == []
            status, http = await run(d, body(input="x" * 700, store=False))
            assert status == 200
            status, http = await run(d, body())  # its items fit; with the body they do not
            assert status == 200 and http.json()["store"] is False
            assert await small.get_response(TENANT, http.json()["id"]) is None
        finally:
            await small.close()


class TestChain:
    async def test_the_prompt_is_the_stateless_one(self, bundle, storage):
        d, dispatcher = stack(bundle, storage)
        _, first = await run(d, body(input="first question", instructions="Be brief."))
        rid = first.json()["id"]
        _, second = await run(d, body(input="second question", previous_response_id=rid))
        assert second.json()["previous_response_id"] == rid
        history = [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": first.json()["output"][0]["content"][0]["text"]},
            {"role": "user", "content": "second question"},
        ]
        await run(d, body(input=history, store=False))
        chained, stateless = dispatcher.requests[1], dispatcher.requests[2]
        assert chained.token_ids == stateless.token_ids  # no "Be brief." carried over
        kept = await storage.get_response(TENANT, second.json()["id"])
        assert [i["role"] for i in orjson.loads(kept.input_items)] == [
            "user", "assistant", "user"
        ]  # fmt: skip

    async def test_unknown_previous_is_400_before_any_engine_work(self, bundle, storage):
        d, dispatcher = stack(bundle, storage)
        status, http = await run(d, body(previous_response_id="resp_nope"))
        assert status == 400 and http.json()["error"]["code"] == "previous_response_not_found"
        assert dispatcher.requests == []


class TestUnavailable:
    async def lock(self, storage):
        conn = sqlite3.connect(storage.config.sqlite_path, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        return conn

    async def test_fail_is_503_before_any_engine_work(self, bundle, storage):
        d, dispatcher = stack(bundle, storage)
        await run(d, body())  # a first write notices nothing wrong
        conn = await self.lock(storage)
        try:
            status, http = await run(d, body())  # the write at its end finds it locked
            assert status == 503 and http.json()["error"]["code"] == "store_unavailable"
            requests = len(dispatcher.requests)
            status, http = await run(d, body())  # known down: refused up front
            assert status == 503 and len(dispatcher.requests) == requests
            status, http = await run(d, body(store=False))
            assert status == 200
        finally:
            conn.rollback()
            conn.close()

    async def test_serve_answers_unstored(self, bundle, tmp_path):
        config = StoreConfig(data_dir=tmp_path, timeout=0.5, when_unavailable="serve")
        serving = Storage(SqliteStore(config.sqlite_path, 0.5), config)
        await serving.start()
        d, _ = stack(bundle, serving)
        conn = await self.lock(serving)
        try:
            status, http = await run(d, body())
            assert status == 200 and http.json()["store"] is False
            status, http = await run(d, body(stream=True))  # known down: said up front
            assert status == 200 and final(http)["store"] is False
        finally:
            conn.rollback()
            conn.close()
            await serving.close()
