"""The preprocessor's metrics by model, and the router's KV predictions against the engines'
reported cached tokens."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from switchyard.preprocessor.auth import Access, KeyRing
from switchyard.preprocessor.edge import Edge
from switchyard.preprocessor.metrics import PreprocessorMetrics
from switchyard.preprocessor.stages.tests.fakes import (
    MODEL,
    FakeDispatcher,
    FakeRouter,
    chat_body,
    deps,
    done,
    tokens,
)
from switchyard.preprocessor.tests.asgi_client import post

CHAT = "/v1/chat/completions"


async def no_app(scope, receive, send):
    raise AssertionError("not a generation request")


def value(metrics: PreprocessorMetrics, name: str, **labels: str) -> float:
    got = metrics.registry.get_sample_value(f"switchyard_preprocessor_{name}", labels)
    return 0.0 if got is None else got


def engine(*replies):
    """A dispatcher whose every attempt gets token batches of `replies`, then `done`."""

    def script(req):
        *batches, cached = replies
        return [tokens(req.request_id, *ids) for ids in batches] + [
            done(req.request_id, cached=cached)
        ]

    return FakeDispatcher(script)


async def test_series_are_labelled_by_model(bundle):
    d = deps(bundle, FakeRouter([1]), engine([100, 101], [102], 3))
    app = Edge(no_app, d, 1 << 20)
    assert (await post(app, CHAT, chat_body(stream=True))).status == 200
    assert (await post(app, CHAT, chat_body(model="nope"))).status == 404
    m = d.metrics
    chat = "chat_completions"
    assert value(m, "requests_total", endpoint=chat, model=MODEL, status="200") == 1
    assert value(m, "requests_total", endpoint=chat, model="", status="404") == 1
    assert value(m, "errors_total", model="", code="model_not_found") == 1
    assert value(m, "time_to_first_token_seconds_count", model=MODEL) == 1
    # One batch of replies here (the fake queues them at once): the series, no observation.
    itl = "switchyard_preprocessor_inter_token_latency_seconds_count"
    assert m.registry.get_sample_value(itl, {"model": MODEL}) == 0
    assert value(m, "request_duration_seconds_count", model=MODEL) == 1
    assert value(m, "output_tokens_total", model=MODEL) == 3
    assert value(m, "cached_tokens_total", model=MODEL) == 3
    text = generate_latest(m.registry).decode()
    assert 'model="nope"' not in text  # a client's model name never becomes a label


@pytest.mark.parametrize(
    ("overlap_blocks", "cached", "outcome"),
    [(0, 0, "exact"), (1, 16, "exact"), (1, 0, "over"), (0, 16, "under")],
)
async def test_kv_predictions_against_the_engine(bundle, overlap_blocks, cached, outcome):
    router = FakeRouter([1], policy="kv", overlap_blocks=overlap_blocks)
    d = deps(bundle, router, engine([100], cached))
    long_prompt = chat_body(messages=[{"role": "user", "content": "tell me a story " * 8}])
    assert (await post(Edge(no_app, d, 1 << 20), CHAT, long_prompt)).status == 200
    m = d.metrics
    assert value(m, "route_predictions_total", model=MODEL, outcome=outcome) == 1
    predicted = value(m, "predicted_cached_tokens_total", model=MODEL)
    assert predicted == overlap_blocks * 16  # the fake instances' block size
    assert value(m, "kv_routed_prompt_tokens_total", model=MODEL) > 0


async def test_other_policies_predict_nothing(bundle):
    d = deps(bundle, FakeRouter([1], policy="round_robin"), engine(16))
    assert (await post(Edge(no_app, d, 1 << 20), CHAT, chat_body())).status == 200
    text = generate_latest(d.metrics.registry).decode()
    assert "switchyard_preprocessor_route_predictions_total{" not in text


async def test_refused_key_probes_and_wrong_methods_are_counted(bundle):
    """A 401 or a 405 on a generation path is an answer an operator should see."""
    d = deps(bundle, FakeRouter([1]), engine([100], 0))
    app = Edge(no_app, d, 1 << 20, access=Access(KeyRing(["sk-right"])))
    refused = await post(app, CHAT, chat_body(), {"authorization": "Bearer sk-wrong"})
    assert refused.status == 401
    scope = {
        "type": "http",
        "method": "GET",
        "path": CHAT,
        "query_string": b"",
        "headers": [(b"authorization", b"Bearer sk-right")],
    }
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["status"] == 405
    m = d.metrics
    chat = "chat_completions"
    assert value(m, "requests_total", endpoint=chat, model="", status="401") == 1
    assert value(m, "requests_total", endpoint=chat, model="", status="405") == 1
    assert value(m, "errors_total", model="", code="invalid_api_key") == 1
    assert value(m, "errors_total", model="", code="method_not_allowed") == 1


def test_a_kv_routed_model_shows_every_prediction_outcome_from_its_first_request():
    """As prometheus-client's labelled children did: all three outcomes at 0 once the model
    has a KV-routed request, the one counted at 1; the token counters per model."""

    class Usage:
        prompt_tokens, completion_tokens, cached_tokens = 10, 4, 3

    m = PreprocessorMetrics()
    m.finished(MODEL, 0.1, Usage(), [(64, 60, 16, 80)])
    text = generate_latest(m.registry).decode()
    for outcome, count in (("exact", 1.0), ("over", 0.0), ("under", 0.0)):
        assert value(m, "route_predictions_total", model=MODEL, outcome=outcome) == count
        assert f'outcome="{outcome}"' in text
    assert value(m, "input_tokens_total", model=MODEL) == 10
    assert value(m, "kv_routed_prompt_tokens_total", model=MODEL) == 80
    m.answered("chat_completions", MODEL, 200)
    assert value(m, "requests_total", endpoint="chat_completions", model=MODEL, status="200") == 1
