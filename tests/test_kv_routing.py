"""End to end: KV-aware routing on mock engines that publish real-format KV events."""

from __future__ import annotations

import re

import httpx
import openai
from e2e_stack import LOCAL, Processes, running_stack, wait_until

from switchyard.common.workers import worker_flag

MODEL = "deepseek-mock"
SYSTEM = "You are the yard master. " + " ".join(
    f"Rule {i}: track {i} takes freight cars bound for siding {i * 7}." for i in range(40)
)


def chat_body(question: str, **extra) -> dict:
    return {
        "model": MODEL,
        "max_tokens": 4,
        "temperature": 0,
        **extra,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
    }


def debug_route(base_url: str, body: dict) -> dict | None:
    reply = httpx.post(base_url + "/debug/route", json=body, timeout=10)
    return reply.json() if reply.status_code == 200 else None


def chosen_overlap(route: dict | None) -> int:
    if route is None:
        return 0
    chosen = route["chosen"]["instance_id"]
    # No workers listed: the preprocessor routed locally (no router answered).
    return next((w["overlap_blocks"] for w in route["workers"] if w["instance_id"] == chosen), 0)


def test_shared_prefix_lands_where_it_is_cached():
    with (
        running_stack("--mock-engines", "vllm,sglang,vllm") as stack,
        openai.OpenAI(base_url=stack.base_url + "/v1", api_key="none", max_retries=0) as client,
    ):
        first = client.chat.completions.create(**chat_body("Which track for siding 70?"))
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        probe = chat_body("Which track for siding 91?")
        route = wait_until(
            lambda: (
                (r := debug_route(stack.base_url, probe))
                and len(r["workers"]) == 3
                and chosen_overlap(r) > 0
                and r
            ),
            what="all three engines routable and the prefix indexed",
        )
        assert route["policy"] == "kv"
        assert len(route["workers"]) == 3
        holder = route["chosen"]["instance_id"]
        assert sorted(w["overlap_blocks"] for w in route["workers"])[:2] == [0, 0]
        # The whole system prompt is cached on one engine: every follow-up goes there and the
        # engine itself reports the cached prefix.
        prefix_tokens = chosen_overlap(route) * 16
        for n in range(6):
            body = chat_body(f"Which track for siding {n * 7}?")
            assert debug_route(stack.base_url, body)["chosen"]["instance_id"] == holder
            reply = client.chat.completions.create(**body)
            assert reply.usage.prompt_tokens_details.cached_tokens >= prefix_tokens


def test_sequence_gap_recovers_through_replay():
    with running_stack(
        "--mock-engines", "vllm", "--mock-arg=--kv-skip-seq=1,2", "--metrics"
    ) as stack:
        metrics_port = stack.report()["children"]["router-0"]["metrics_port"]
        bodies = [chat_body(f"Question number {n} about the yard?") for n in range(4)]
        for body in bodies:
            assert (
                httpx.post(
                    stack.base_url + "/v1/chat/completions", json=body, timeout=30
                ).status_code
                == 200
            )
        # Batches 1 and 2 were never published: only a replay can have put them in the index.
        for body in bodies:
            wait_until(
                lambda b=body: (
                    chosen_overlap(debug_route(stack.base_url, b))
                    >= (debug_route(stack.base_url, b) or {}).get("prompt_blocks", 1)
                ),
                what="every prompt fully indexed",
            )
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert float(re.search(r"^switchyard_router_kv_replays_total (\S+)", text, re.M)[1]) >= 1


def test_restarted_router_rebuilds_its_index():
    with Processes() as procs:
        engine = procs.serve(
            "engine", "mock-engine", "--protocol", "sglang", "--port", "0",
            "--kv-events-endpoint", LOCAL, "--kv-replay-endpoint", LOCAL, "--speedup", "4",
        )  # fmt: skip
        worker = worker_flag(
            f"grpc://127.0.0.1:{engine['port']}",
            kv_events=engine["kv_events"],
            kv_replay=engine["kv_replay"],
        )
        fleet = procs.serve(
            "fleet", "fleet", "--worker", worker, "--control", LOCAL, "--events", LOCAL,
            "--probe-interval", "0.5",
        )  # fmt: skip
        fleet_flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
        router = procs.serve("router", "router", "--bind", LOCAL, *fleet_flags)["bind"]
        dispatcher = procs.serve("dispatcher", "dispatcher", "--bind", LOCAL, *fleet_flags)["bind"]
        http = procs.serve(
            "preprocessor", "preprocessor", "--port", "0", "--router", router,
            "--dispatcher", dispatcher, "--route-timeout", "1", *fleet_flags,
        )["port"]  # fmt: skip
        base = f"http://127.0.0.1:{http}"
        wait_until(lambda: _status(base + "/ready") == 200, what="the stack to be ready")
        body = chat_body("Which track for siding 70?")
        assert httpx.post(base + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        wait_until(lambda: chosen_overlap(debug_route(base, body)) > 0, what="indexed prefix")
        procs.kill("router")
        procs.serve("router", "router", "--bind", router, *fleet_flags)
        # A fresh router joins the engine's stream late and replays it from sequence 0.
        wait_until(
            lambda: chosen_overlap(debug_route(base, body)) > 0,
            timeout=30,
            what="the restarted router to rebuild its index",
        )


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None
