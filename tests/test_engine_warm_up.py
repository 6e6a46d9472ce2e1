"""End to end: an engine that warms up as the real vLLM servicer does (the mock engine's
--warm-up-requests, recorded from a real one in services/mock_engine/tests/fixtures/
vllm_real.json): its requests fill the prefix cache and publish their blocks, the cache is
reset, and that AllBlocksCleared is published only at the engine's next step.

Regression (issue 31, fixed by issue 32): fleet admitted an engine in the middle of its
warm-up (HealthCheck says healthy, the standard health service NOT_SERVING), and the router,
replaying the engine's KV events from 0 at admission, indexed the warm-up's blocks, which the
engine no longer held, until its first request (the "Admission" paragraph of
docs/routing.md, "KV events: engines that bind, engines that connect").
"""

from __future__ import annotations

import time

import httpx
import openai
from e2e_stack import Processes, running_stack, wait_until
from support.mock_engine import free_port

from switchyard.common.workers import worker_flag

MODEL = "deepseek-mock"
WARM_UP_REQUESTS = 6  # 4 blocks of prompt each
BLOCK = 16  # the mock's block size


def workers(base: str) -> dict[str, dict]:
    try:
        reply = httpx.get(f"{base}/admin/workers", timeout=10)
    except httpx.HTTPError:
        return {}
    return {w["url"]: w for w in reply.json()["data"]} if reply.status_code == 200 else {}


def router_metrics(stack) -> str:
    port = stack.report()["children"]["router-0"]["metrics_port"]
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


def metric(text: str, name: str, worker: str | None = None) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name)] not in " {":
            continue
        if worker is None or f'worker="{worker}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_warm_up_blocks_are_not_claimed_after_admission():
    port, pub, replay = free_port(), free_port(), free_port()
    url = f"grpc://127.0.0.1:{port}"
    kv_events, kv_replay = f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"
    worker = worker_flag(url, kv_events=kv_events, kv_replay=kv_replay)
    with (
        running_stack("--worker", worker, "--metrics", ready=False) as stack,
        Processes() as procs,
    ):
        base = stack.base_url
        # The engine starts after the gateway (its port 0 convention binds the KV sockets).
        started = time.monotonic()
        procs.serve(
            "warming-engine", "mock-engine", "--protocol", "vllm", "--port", str(port),
            # a wildcard host: the engine binds its KV sockets, as vLLM does for tcp://*:P
            "--kv-events-endpoint", f"tcp://*:{pub}", "--kv-replay-endpoint", f"tcp://*:{replay}",
            "--warm-up-requests", str(WARM_UP_REQUESTS), "--warm-up-ms", "6000",
        )  # fmt: skip
        states = []
        while time.monotonic() - started < 4.0:  # well inside the warm-up
            states.append(workers(base).get(url, {}).get("state"))
            time.sleep(0.2)
        assert "ready" not in states, states
        wait_until(
            lambda: workers(base).get(url, {}).get("state") == "ready",
            timeout=60,
            what="the engine admitted once warmed up",
        )
        wait_until(stack.ready_path.exists, timeout=60, what="the stack ready")
        # The router replays the engine's events from 0: the warm-up's stores arrive, stamped
        # before the admission, and are not indexed.
        text = wait_until(
            lambda: (
                (t := router_metrics(stack))
                and (metric(t, "switchyard_router_kv_pre_admission_stores_total") or 0)
                >= WARM_UP_REQUESTS
                and t
            ),
            timeout=30,
            what="the warm-up's stores replayed",
        )
        assert metric(text, "switchyard_router_kv_index_blocks", url) == 0
        # The first request: the engine publishes the reset, then the request's own blocks,
        # which are indexed.
        with openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0) as client:
            client.completions.create(
                model=MODEL, prompt=list(range(1000, 1000 + 3 * BLOCK + 5)), max_tokens=1
            )
        wait_until(
            lambda: metric(router_metrics(stack), "switchyard_router_kv_index_blocks", url) == 3,
            timeout=30,
            what="the first request's blocks indexed (and nothing else)",
        )
