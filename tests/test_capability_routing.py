"""Routing by capability end to end: a model served by SGLang and vLLM mock engines. Seeded
requests (SGLang's gRPC API has no seed) are served, by vLLM engines only, and reproducible;
/debug/route shows the decision; a seeded stream whose vLLM engine dies migrates to the other
vLLM engine, never to the SGLang one; a model with SGLang engines alone refuses a seed with a
400 naming it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from e2e_stack import Processes, running_stack, wait_until

MODEL = "deepseek-mock"
pytestmark = pytest.mark.timeout(300)


def access_lines(stack) -> list[dict[str, Any]]:
    return [
        r
        for r in (json.loads(line) for line in stack.log().splitlines() if line.startswith("{"))
        if r.get("logger") == "switchyard.access"
    ]


def access(stack, request_id: str) -> dict[str, Any]:
    def line() -> dict[str, Any] | None:
        for record in access_lines(stack):
            if record.get("request_id") == request_id:
                return record
        return None

    return wait_until(line, timeout=10, what=f"the access line of {request_id}")


def admin(base: str, method: str, path: str = "", body=None) -> httpx.Response:
    return httpx.request(method, f"{base}/admin/workers{path}", json=body, timeout=30)


def worker_ids(base: str) -> dict[str, str]:
    """url -> instance id (decimal), of the ready workers."""
    data = admin(base, "GET").json()["data"]
    return {w["url"]: str(w["instance_id"]) for w in data if w["state"] == "ready"}


def seeded(client: openai.OpenAI, seed: int, request_id: str, **extra) -> str:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a story about rivers."}],
        max_tokens=16,
        temperature=1.0,
        seed=seed,
        extra_headers={"x-request-id": request_id},
        extra_body={"ignore_eos": True},
        **extra,
    )
    return reply.choices[0].message.content or ""


@pytest.fixture(scope="module")
def mixed():
    with Processes() as procs:
        started = {
            name: procs.start_ready(
                f"engine-{name}", "mock-engine", "--protocol", protocol, "--port", "0",
                "--model-name", MODEL, "--speedup", "4",
            )
            for name, protocol in (("sglang", "sglang"), ("vllm", "vllm"))
        }  # fmt: skip
        urls = {name: f"grpc://127.0.0.1:{s.result()['port']}" for name, s in started.items()}
        workers = [flag for url in urls.values() for flag in ("--worker", url)]
        with running_stack(*workers, "--log-format", "json") as stack:
            stack.urls = urls
            wait_until(lambda: len(worker_ids(stack.base_url)) == 2, what="both engines ready")
            yield stack


class TestMixedFleet:
    def test_seeded_requests_are_served_by_vllm_and_reproducible(self, mixed):
        with openai.OpenAI(base_url=mixed.base_url + "/v1", api_key="x", max_retries=0) as c:
            first = [seeded(c, 42, f"seed42-{n}") for n in range(3)]
            other = seeded(c, 7, "seed7")
        assert first[0] and first.count(first[0]) == 3, first
        assert other != first[0]
        for request_id in ("seed42-0", "seed42-1", "seed42-2", "seed7"):
            line = access(mixed, request_id)
            assert line["status"] == 200 and line["worker"] == mixed.urls["vllm"], line

    def test_a_seeded_stream_is_the_same_answer(self, mixed):
        with openai.OpenAI(base_url=mixed.base_url + "/v1", api_key="x", max_retries=0) as c:
            whole = seeded(c, 11, "seed11-whole")
            stream = c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell me a story about rivers."}],
                max_tokens=16,
                temperature=1.0,
                seed=11,
                stream=True,
                extra_headers={"x-request-id": "seed11-stream"},
                extra_body={"ignore_eos": True},
            )
            text = "".join(
                chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices
            )
        assert text == whole
        assert access(mixed, "seed11-stream")["worker"] == mixed.urls["vllm"]

    def test_debug_route_shows_the_decision(self, mixed):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "seed": 3}
        reply = httpx.post(mixed.base_url + "/debug/route", json=body, timeout=30).json()
        assert reply["requires"] == ["seed"]
        assert reply["chosen"]["url"] == mixed.urls["vllm"]
        filtered = {w["url"]: w["filtered_by"] for w in reply["workers"]}
        assert filtered[mixed.urls["sglang"]] == "capable"
        assert filtered[mixed.urls["vllm"]] == ""
        del body["seed"]
        unseeded = httpx.post(mixed.base_url + "/debug/route", json=body, timeout=30).json()
        assert unseeded["requires"] == []
        assert all(w["filtered_by"] == "" for w in unseeded["workers"])


def test_a_seed_on_sglang_engines_alone_is_a_400():
    with running_stack("--mock-engines", "sglang") as stack:
        with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0) as c:
            with pytest.raises(openai.BadRequestError) as err:
                c.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], seed=1
                )
        assert err.value.body["param"] == "seed"  # type: ignore[index]
        assert err.value.body["code"] == "unsupported_value"  # type: ignore[index]


def test_a_migration_stays_among_engines_that_can_honour_it():
    """vLLM engine `a` crashes mid-stream (--exit-after-tokens); the SGLang engine is idle and
    would otherwise be a candidate; the stream ends on vLLM engine `b`."""
    with Processes() as procs:
        specs = {
            "a": ("vllm", ["--exit-after-tokens", "6", "--itl-ms", "150"]),
            "b": ("vllm", []),
            "s": ("sglang", []),
        }
        started = {
            name: procs.start_ready(
                f"engine-{name}", "mock-engine", "--protocol", protocol, "--port", "0",
                "--model-name", MODEL, *extra,
            )
            for name, (protocol, extra) in specs.items()
        }  # fmt: skip
        urls = {name: f"grpc://127.0.0.1:{s.result()['port']}" for name, s in started.items()}
        workers = [flag for url in urls.values() for flag in ("--worker", url)]
        with running_stack(*workers, "--log-format", "json") as stack:
            base = stack.base_url
            wait_until(lambda: len(worker_ids(base)) == 3, what="three engines ready")
            ids = worker_ids(base)
            assert admin(base, "POST", f"/{ids[urls['b']]}/drain").status_code == 200
            body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "seed": 5}
            wait_until(
                lambda: (
                    httpx.post(base + "/debug/route", json=body, timeout=30).json()["chosen"]["url"]
                    == urls["a"]
                ),
                what="a seeded request routed to engine a while b is drained",
            )
            with openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0) as c:
                stream = c.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Tell me about migration."}],
                    max_tokens=24,
                    temperature=1.0,
                    seed=5,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_headers={"x-request-id": "migrating-seed"},
                    extra_body={"ignore_eos": True},
                )
                chunks = iter(stream)
                next(chunks)  # the stream runs on engine a
                assert admin(base, "POST", f"/{ids[urls['b']]}/resume").status_code == 200
                usage = [chunk.usage for chunk in chunks if chunk.usage]
            assert usage[-1].completion_tokens == 24
            line = access(stack, "migrating-seed")
            assert line["migrations"] >= 1 and line["worker"] == urls["b"], line
            assert urls["s"] not in (line["worker"] or "")
