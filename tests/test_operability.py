"""What an operator sees, through a real stack (`switchyard up --log-format json` over two mock
engines serving two models, tracing to an in-process OTLP collector): X-Request-Id from the
client to the engine, one access line per request, metrics by model and worker URL, every
dashboard query's metric exported, every exported metric documented, and one trace per
request with the named spans whose context reaches the engine."""

from __future__ import annotations

import json
import threading
import uuid
from concurrent import futures
from typing import Any

import grafana_dashboard as grafana
import grpc
import httpx
import openai
import pytest
from docs_index import metrics_message, undocumented_metrics
from e2e_stack import Processes, running_stack, wait_until
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

MODELS = {"model-a": "sglang", "model-b": "vllm"}
QUESTION = [{"role": "user", "content": "Which track does the night freight take?"}]
SPANS = {"POST /v1/chat/completions", "tokenize", "route", "dispatch", "first_token"}
PRE = "switchyard_preprocessor_"
DISPATCHER = "switchyard_dispatcher_"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace collector in this process: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self._lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 - the gRPC method name
        with self._lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.spans.extend(scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> list[Any]:
        with self._lock:
            return [s for s in self.spans if s.trace_id.hex() == trace_id]


@pytest.fixture(scope="module")
def collector():
    sink = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sink.endpoint = f"http://127.0.0.1:{port}"
    yield sink
    server.stop(grace=None)


@pytest.fixture(scope="module")
def stack(collector):
    with Processes() as procs:
        started = {
            model: procs.start_ready(
                f"engine-{model}", "mock-engine", "--protocol", protocol, "--port", "0",
                "--model-name", model, "--log-requests",
            )
            for model, protocol in MODELS.items()
        }  # fmt: skip
        urls = {model: f"grpc://127.0.0.1:{s.result()['port']}" for model, s in started.items()}
        workers = [flag for url in urls.values() for flag in ("--worker", url)]
        with running_stack(
            *workers,
            "--log-format",
            "json",
            f"--preprocessor-arg=--otlp-endpoint={collector.endpoint}",
        ) as running:
            running.procs, running.urls = procs, urls
            for model in MODELS:  # both models' tokenizers in (the stack is ready with one)
                wait_until(lambda m=model: _answers(running.base_url, m), what=f"{model} served")
            yield running


def _answers(base: str, model: str) -> bool:
    body = {"model": model, "messages": QUESTION, "max_tokens": 1}
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=30).status_code == 200


def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key="none", max_retries=0)


def json_lines(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def access_lines(stack) -> list[dict[str, Any]]:
    return [r for r in json_lines(stack.log()) if r["logger"] == "switchyard.access"]


def scrape(port: int) -> dict[str, Any]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(families: dict[str, Any], name: str, **labels: str) -> float:
    for family in families.values():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def metrics_ports(stack) -> dict[str, int]:
    children = stack.report()["children"]
    ports = {name: r["metrics_port"] for name, r in children.items() if r.get("metrics_port")}
    ports["preprocessor-http"] = children["preprocessor"]["port"]
    return ports


class TestRequestIds:
    def test_round_trip_and_arrival_at_the_engine(self, stack):
        rid = f"client-{uuid.uuid4().hex[:8]}"
        with client(stack) as c:
            raw = c.chat.completions.with_raw_response.create(
                model="model-b",
                messages=QUESTION,
                max_tokens=3,
                extra_headers={"X-Request-Id": rid},
            )
            assert raw.headers["x-request-id"] == rid
            assert raw.parse().id == rid
            chunks = list(
                c.chat.completions.create(
                    model="model-a",
                    messages=QUESTION,
                    max_tokens=3,
                    stream=True,
                    extra_headers={"X-Request-Id": rid + "-s"},
                )
            )
        assert chunks and {chunk.id for chunk in chunks} == {rid + "-s"}
        # The engine request id starts with the client's id, and x-request-id came as metadata.
        for model, expected in (("model-b", rid), ("model-a", rid + "-s")):
            engine_log = stack.procs.log(f"engine-{model}")
            lines = [
                line for line in engine_log.splitlines() if f"x-request-id={expected} " in line
            ]
            assert len(lines) == 1, engine_log[-2000:]
            assert f"Generate request_id={expected}-" in lines[0]

    def test_a_bad_header_is_refused(self, stack):
        reply = httpx.post(
            stack.base_url + "/v1/chat/completions",
            json={"model": "model-a", "messages": QUESTION, "max_tokens": 1},
            headers={"X-Request-Id": "no spaces please"},
            timeout=30,
        )
        assert reply.status_code == 400
        assert reply.json()["error"]["param"] == "X-Request-Id"


class TestAccessLog:
    def test_one_json_line_per_request_with_its_fields(self, stack):
        ids = [f"acc-{uuid.uuid4().hex[:8]}-{n}" for n in range(4)]
        with client(stack) as c:
            for n, rid in enumerate(ids):
                model = list(MODELS)[n % 2]
                c.chat.completions.create(
                    model=model,
                    messages=QUESTION,
                    max_tokens=4,
                    extra_body={"ignore_eos": True},  # exactly 4: a sampled EOS may come first
                    extra_headers={"X-Request-Id": rid},
                )
            with pytest.raises(openai.NotFoundError):
                c.chat.completions.create(
                    model="nope", messages=QUESTION, extra_headers={"X-Request-Id": ids[0] + "x"}
                )
        # The 404's line too: each line is written after its answer, so it can lag the client.
        logged = {*ids, ids[0] + "x"}
        wait_until(lambda: len([r for r in access_lines(stack) if r["request_id"] in logged]) == 5)
        lines = {r["request_id"]: r for r in access_lines(stack) if r["request_id"] in ids}
        for n, rid in enumerate(ids):
            line = lines[rid]
            model = list(MODELS)[n % 2]
            assert line["model"] == model and line["status"] == 200
            assert line["worker"] == stack.urls[model]
            assert line["route"] == "/v1/chat/completions" and line["stream"] is False
            assert line["completion_tokens"] == 4 and line["prompt_tokens"] > 0
            assert line["cached_tokens"] >= 0 and line["total_ms"] > 0
            assert line["ttft_ms"] is None  # asked of the engine whole: no first token to time
            assert line["migrations"] == 0 and line["client_disconnect"] is False
            assert line["service"] == "preprocessor"
            assert line["instance"] == stack.base_url
        failed = [r for r in access_lines(stack) if r["request_id"] == ids[0] + "x"]
        assert [(r["status"], r["error"]) for r in failed] == [(404, "model_not_found")]

    def test_every_service_logs_json(self, stack):
        records = json_lines(stack.log())
        services = {r["service"] for r in records}
        assert {"up", "fleet", "router", "dispatcher", "preprocessor"} <= services
        for record in records:
            assert {"ts", "level", "service", "instance", "logger", "msg"} <= set(record)
        bound = {r["service"]: r["instance"] for r in records if r["instance"]}
        assert bound["preprocessor"] == stack.base_url
        # `up` binds its dispatchers on Unix sockets in its folder (a loopback port when the
        # folder's path is too long for one)
        assert bound["dispatcher"].startswith(("ipc://", "tcp://127.0.0.1:"))


class TestMetrics:
    def test_labelled_by_model_and_worker_url(self, stack):
        with client(stack) as c:
            for model in MODELS:
                for _ in range(2):  # streamed: a whole (not streamed) request has no TTFT
                    for _chunk in c.chat.completions.create(
                        model=model,
                        messages=QUESTION,
                        max_tokens=3,
                        stream=True,
                        # 3 tokens each, even when this test runs alone: a sampled EOS may
                        # come first, and output_tokens_total must reach 6
                        extra_body={"ignore_eos": True},
                    ):
                        pass
        ports = metrics_ports(stack)
        pre = scrape(ports["preprocessor-http"])
        dispatcher = scrape(ports["dispatcher-0"])
        router = scrape(ports["router-0"])
        fleet = scrape(ports["fleet"])
        for model, url in stack.urls.items():
            at = {"model": model, "worker": url}
            assert sample(pre, PRE + "time_to_first_token_seconds_count", model=model) >= 2
            assert sample(pre, PRE + "output_tokens_total", model=model) >= 6
            assert sample(pre, PRE + "requests_total", model=model, status="200") >= 2
            assert sample(dispatcher, DISPATCHER + "generations_total", **at) >= 2
            ttft = DISPATCHER + "engine_time_to_first_token_seconds_count"
            assert sample(dispatcher, ttft, **at) >= 2
            assert sample(router, "switchyard_router_routed_total", **at) >= 2
            assert sample(fleet, "switchyard_fleet_worker_routable", **at) == 1
            in_flight = [s for s in dispatcher[DISPATCHER + "in_flight"].samples if s.labels == at]
            assert in_flight and in_flight[0].value == 0  # nothing left running

    def test_every_dashboard_query_names_an_exported_metric(self, stack):
        exported: set[str] = set()
        for port in metrics_ports(stack).values():
            exported |= set(scrape(port))
        wanted = grafana.families(grafana.load())
        assert wanted, "the dashboard reads no metric"
        assert sorted(wanted - exported) == []

    def test_every_exported_metric_is_documented(self, stack):
        missing: set[str] = set()
        where = []
        for name, port in metrics_ports(stack).items():
            families = {f for f in scrape(port) if f.startswith("switchyard_")}
            assert families, name
            if undocumented := undocumented_metrics(families):
                missing.update(undocumented)
                where.append(name)
        assert not missing, metrics_message(sorted(missing), ", ".join(where))


class TestTracing:
    def test_one_trace_with_the_named_spans_reaching_the_engine(self, stack, collector):
        trace_id = uuid.uuid4().hex
        traceparent = f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"
        reply = httpx.post(
            stack.base_url + "/v1/chat/completions",
            json={"model": "model-a", "messages": QUESTION, "max_tokens": 3, "stream": True},
            headers={"traceparent": traceparent, "X-Request-Id": f"traced-{trace_id[:8]}"},
            timeout=30,
        )
        assert reply.status_code == 200
        # Spans leave in batches (every 5 s by default).
        wait_until(
            lambda: SPANS <= {s.name for s in collector.of_trace(trace_id)},
            timeout=60,
            what="the request's spans at the collector",
        )
        spans = {s.name: s for s in collector.of_trace(trace_id)}
        root = spans["POST /v1/chat/completions"]
        assert root.parent_span_id.hex() == traceparent.split("-")[2]  # the client's span
        assert spans["dispatch"].parent_span_id == root.span_id
        assert spans["first_token"].parent_span_id == spans["dispatch"].span_id
        engine_log = stack.procs.log("engine-model-a")
        sent = f"traceparent=00-{trace_id}-{spans['dispatch'].span_id.hex()}-01"
        assert sent in engine_log, engine_log[-2000:]
