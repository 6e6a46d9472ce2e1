"""Tracing: the request's spans (SDK in-memory exporter), the client's traceparent continued,
the dispatch span's context sent to the engine; off, OpenTelemetry is never imported."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from switchyard.common import errors
from switchyard.preprocessor.edge import Edge
from switchyard.preprocessor.stages.tests.fakes import (
    FakeDispatcher,
    FakeRouter,
    chat_body,
    deps,
    done,
    failed,
    tokens,
)
from switchyard.preprocessor.tests.asgi_client import post
from switchyard.preprocessor.tracing import Tracing

CHAT = "/v1/chat/completions"
CUT = errors.CANNOT_CONNECT
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


async def no_app(scope, receive, send):
    raise AssertionError("not a generation request")


@pytest.fixture
def exporter():
    return InMemorySpanExporter()


def traced(bundle, exporter, script, instances=(1,), prefill=None):
    dispatcher = FakeDispatcher(script)
    tracing = Tracing(SimpleSpanProcessor(exporter), instance="http://127.0.0.1:1")
    d = deps(bundle, FakeRouter(list(instances), prefill=prefill), dispatcher, tracing=tracing)
    return Edge(no_app, d, 1 << 20), dispatcher


def by_name(exporter):
    spans = {}
    for span in exporter.get_finished_spans():
        spans.setdefault(span.name, []).append(span)
    return spans


class TestSpans:
    async def test_the_named_spans_in_one_trace(self, bundle, exporter):
        def script(req):
            return [tokens(req.request_id, 100), tokens(req.request_id, 101), done(req.request_id)]

        app, dispatcher = traced(bundle, exporter, script)
        headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "X-Request-Id": "t-1"}
        reply = await post(app, CHAT, chat_body(stream=True), headers)
        assert reply.status == 200
        spans = by_name(exporter)
        assert {"template", "tokenize", "route", "dispatch", "first_token"} <= set(spans)
        (root,) = spans["POST /v1/chat/completions"]
        assert f"{root.context.trace_id:032x}" == TRACE_ID  # the client's trace continues
        assert f"{root.parent.span_id:016x}" == PARENT_ID
        assert root.attributes["switchyard.request_id"] == "t-1"
        assert root.attributes["switchyard.completion_tokens"] == 2
        assert root.attributes["http.response.status_code"] == 200
        assert root.resource.attributes["service.instance.id"] == "http://127.0.0.1:1"
        everything = exporter.get_finished_spans()
        assert {s.context.trace_id for s in everything} == {root.context.trace_id}
        (dispatch,) = spans["dispatch"]
        (first,) = spans["first_token"]
        assert first.parent.span_id == dispatch.context.span_id
        assert dispatch.parent.span_id == root.context.span_id
        assert dispatch.attributes["switchyard.worker"] == "grpc://10.0.0.1:1"
        (sent,) = dispatcher.requests
        assert sent.traceparent == f"00-{TRACE_ID}-{dispatch.context.span_id:016x}-01"

    async def test_a_migration(self, bundle, exporter):
        def script(req):
            if req.instance_id == 1:
                return [tokens(req.request_id, 100), failed(req.request_id, 1, CUT)]
            return [tokens(req.request_id, 101), done(req.request_id)]

        app, dispatcher = traced(bundle, exporter, script, (1, 2))
        assert (await post(app, CHAT, chat_body())).status == 200
        spans = by_name(exporter)
        (migration,) = spans["migration"]
        assert migration.attributes["switchyard.kind"] == errors.CANNOT_CONNECT
        assert migration.attributes["switchyard.tokens_so_far"] == 1
        broken, good = sorted(spans["dispatch"], key=lambda s: s.start_time)
        assert broken.status.status_code is StatusCode.ERROR
        assert good.status.status_code is not StatusCode.ERROR
        assert len(spans["route"]) == 2
        first, second = dispatcher.requests
        assert first.traceparent != second.traceparent  # each attempt its own span

    async def test_a_prefill_hop(self, bundle, exporter):
        def script(req):
            if req.instance_id == 9:  # the prefill leg: its KV goes to the decode engine
                return [done(req.request_id)]
            return [tokens(req.request_id, 100), done(req.request_id)]

        app, dispatcher = traced(bundle, exporter, script, (1,), prefill=9)
        assert (await post(app, CHAT, chat_body())).status == 200
        spans = by_name(exporter)
        (dispatch,) = spans["dispatch"]
        (hop,) = spans["prefill_hop"]
        assert hop.parent.span_id == dispatch.context.span_id
        assert hop.context.trace_id == dispatch.context.trace_id
        assert hop.status.status_code is not StatusCode.ERROR
        assert sorted(r.instance_id for r in dispatcher.requests) == [1, 9]  # both legs
        # Both legs carry the dispatch span's context, so both engines' logs join the trace.
        context = (f"{dispatch.context.trace_id:032x}", f"{dispatch.context.span_id:016x}")
        assert {tuple(r.traceparent.split("-")[1:3]) for r in dispatcher.requests} == {context}

    async def test_an_invalid_traceparent_starts_a_new_trace(self, bundle, exporter):
        app, _ = traced(bundle, exporter, lambda req: [done(req.request_id)])
        await post(app, CHAT, chat_body(), {"traceparent": "00-zz-not-valid"})
        (root,) = by_name(exporter)["POST /v1/chat/completions"]
        assert root.parent is None

    async def test_a_failed_request(self, bundle, exporter):
        app, _ = traced(bundle, exporter, lambda req: [done(req.request_id)])
        await post(app, CHAT, chat_body(model="unknown"))
        (root,) = by_name(exporter)["POST /v1/chat/completions"]
        assert root.attributes["error.type"] == "model_not_found"
        assert root.attributes["http.response.status_code"] == 404


class TestSampling:
    async def test_a_request_sampled_out_exports_nothing_but_still_propagates(
        self, bundle, exporter
    ):
        dispatcher = FakeDispatcher(lambda req: [done(req.request_id)])
        tracing = Tracing(SimpleSpanProcessor(exporter), sample_ratio=0.0)
        app = Edge(no_app, deps(bundle, FakeRouter([1]), dispatcher, tracing=tracing), 1 << 20)
        assert (await post(app, CHAT, chat_body())).status == 200
        assert exporter.get_finished_spans() == ()
        flags = int(dispatcher.requests[0].traceparent.rsplit("-", 1)[1], 16)
        assert flags & 1 == 0  # not sampled, and passed on as such

    async def test_the_clients_sampling_decision_wins(self, bundle, exporter):
        dispatcher = FakeDispatcher(lambda req: [done(req.request_id)])
        tracing = Tracing(SimpleSpanProcessor(exporter), sample_ratio=0.0)
        app = Edge(no_app, deps(bundle, FakeRouter([1]), dispatcher, tracing=tracing), 1 << 20)
        headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        assert (await post(app, CHAT, chat_body(), headers)).status == 200
        assert {s.context.trace_id for s in exporter.get_finished_spans()} == {int(TRACE_ID, 16)}


def test_off_nothing_of_opentelemetry_is_loaded():
    """Tracing off costs no import (and so nothing per request beyond a None check)."""
    code = (
        "import sys\n"
        "import switchyard.preprocessor.cli, switchyard.preprocessor.stages.endpoints\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')"
        " or m == 'switchyard.preprocessor.tracing'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
