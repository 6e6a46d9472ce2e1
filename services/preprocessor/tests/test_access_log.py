"""One access line per API request, with its fields, in text and in JSON."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from switchyard.common import errors
from switchyard.common.logs import JsonFormatter, LogContext, TextFormatter
from switchyard.preprocessor.access_log import AccessLog
from switchyard.preprocessor.edge import Edge
from switchyard.preprocessor.stages.tests.fakes import (
    MODEL,
    FakeDispatcher,
    FakeRouter,
    chat_body,
    deps,
    done,
    failed,
    tokens,
)
from switchyard.preprocessor.tests.asgi_client import Exchange, post

CHAT = "/v1/chat/completions"
CUT = errors.CANNOT_CONNECT
FIELDS = {
    "request_id", "model", "route", "worker", "prefill_worker", "status", "stream",
    "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms", "total_ms",
    "migrations", "client_disconnect", "error",
}  # fmt: skip


async def no_app(scope, receive, send):
    raise AssertionError("not a generation request")


def edge(bundle, script, instances=(1,), access=True):
    d = deps(bundle, FakeRouter(list(instances)), FakeDispatcher(script))
    return Edge(no_app, d, 1 << 20, AccessLog(d.instances) if access else None)


def lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "switchyard.access"]


def formatted(record: logging.LogRecord, formatter: logging.Formatter) -> str:
    context = LogContext("preprocessor")
    context.instance = "http://127.0.0.1:8000"
    context.filter(record)
    return formatter.format(record)


@pytest.fixture(autouse=True)
def info(caplog):
    caplog.set_level(logging.INFO, logger="switchyard.access")


class TestOneLinePerRequest:
    async def test_a_streamed_request(self, bundle, caplog):
        def script(req):
            rid = req.request_id
            return [tokens(rid, 100), tokens(rid, 101), done(rid, cached=3)]

        app = edge(bundle, script)
        await post(app, CHAT, chat_body(stream=True), {"X-Request-Id": "r-1"})
        (record,) = lines(caplog)
        fields = record.fields
        assert set(fields) == FIELDS
        assert fields["request_id"] == "r-1" and fields["model"] == MODEL
        assert fields["route"] == CHAT and fields["status"] == 200 and fields["stream"] is True
        assert fields["worker"] == "grpc://10.0.0.1:1" and fields["prefill_worker"] is None
        assert fields["completion_tokens"] == 2 and fields["cached_tokens"] == 3
        assert fields["prompt_tokens"] > 0
        assert fields["ttft_ms"] is not None and fields["total_ms"] >= fields["ttft_ms"]
        assert fields["migrations"] == 0 and fields["client_disconnect"] is False
        assert fields["error"] is None

        text = formatted(record, TextFormatter())
        assert "preprocessor INFO switchyard.access: POST /v1/chat/completions " in text
        assert " request_id=r-1 model=m route=/v1/chat/completions " in text
        assert " worker=grpc://10.0.0.1:1 prefill_worker=- status=200 stream=true " in text
        assert " completion_tokens=2 " in text and " client_disconnect=false error=-" in text

        parsed = orjson.loads(formatted(record, JsonFormatter()))
        assert parsed["msg"] == "POST /v1/chat/completions"
        assert parsed["service"] == "preprocessor"
        assert parsed["instance"] == "http://127.0.0.1:8000"
        assert parsed["level"] == "INFO" and parsed["logger"] == "switchyard.access"
        assert {k: parsed[k] for k in FIELDS} == fields

    async def test_a_migrated_request_counts_its_migrations(self, bundle, caplog):
        def script(req):
            if req.instance_id == 1:
                return [tokens(req.request_id, 100), failed(req.request_id, 1, CUT)]
            return [tokens(req.request_id, 101), done(req.request_id)]

        await post(edge(bundle, script, (1, 2)), CHAT, chat_body())
        (record,) = lines(caplog)
        assert record.fields["migrations"] == 1
        assert record.fields["worker"] == "grpc://10.0.0.2:1"  # the one that finished it
        assert record.fields["status"] == 200 and record.fields["completion_tokens"] == 2

    async def test_failures_are_logged_with_their_code(self, bundle, caplog):
        app = edge(bundle, lambda req: [done(req.request_id)])
        await post(app, CHAT, chat_body(model="unknown"))
        await post(app, CHAT, b"{broken")
        missing, broken = (r.fields for r in lines(caplog))
        assert (missing["status"], missing["error"]) == (404, "model_not_found")
        assert missing["model"] == "unknown"
        assert (broken["status"], broken["error"], broken["model"]) == (400, "invalid_json", None)
        assert broken["request_id"].startswith("chatcmpl-")

    async def test_a_client_that_leaves(self, bundle, caplog):
        app = edge(bundle, lambda req: None)  # the engine stays silent
        scope = {"type": "http", "method": "POST", "path": CHAT, "headers": [], "query_string": b""}
        exchange = Exchange(chat_body(stream=True))
        serving = asyncio.create_task(app(scope, exchange.receive, exchange.send))
        await asyncio.sleep(0.05)
        exchange.gone.set()
        await asyncio.wait_for(serving, 5)
        (record,) = lines(caplog)
        assert record.fields["status"] == 499 and record.fields["client_disconnect"] is True

    async def test_off(self, bundle, caplog):
        app = edge(bundle, lambda req: [done(req.request_id)], access=False)
        await post(app, CHAT, chat_body())
        assert lines(caplog) == []
