"""/ready means a request could succeed now; /health is liveness only."""

from __future__ import annotations

import httpx
from e2e_stack import LOCAL, Processes, http_status, wait_until


def ready(base: str) -> tuple[int, str]:
    reply = httpx.get(base + "/ready", timeout=5)
    return reply.status_code, reply.text


def test_ready_is_503_while_no_dispatcher_is_reachable():
    with Processes() as procs:
        engine = procs.serve("engine", "mock-engine", "--protocol", "sglang", "--port", "0")
        fleet = procs.serve(
            "fleet", "fleet", "--control", LOCAL, "--events", LOCAL, "--probe-interval", "0.5",
            "--worker", f"grpc://127.0.0.1:{engine['port']}",
        )  # fmt: skip
        fleet_flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
        router = procs.serve("router", "router", "--bind", LOCAL, *fleet_flags)["bind"]
        dispatcher = procs.serve("dispatcher", "dispatcher", "--bind", LOCAL, *fleet_flags)["bind"]
        http = procs.serve(
            "preprocessor", "preprocessor", "--port", "0", "--router", router,
            "--dispatcher", dispatcher, "--dispatcher-wait", "1", *fleet_flags,
        )["port"]  # fmt: skip
        base = f"http://127.0.0.1:{http}"
        wait_until(lambda: ready(base)[0] == 200, timeout=60, what="ready")

        procs.kill("dispatcher")
        wait_until(lambda: ready(base)[0] == 503, timeout=30, what="not ready")
        status, body = ready(base)
        assert status == 503 and "no dispatcher is reachable" in body
        assert http_status(base + "/health") == 200  # alive all the same
        # And it meant it: a request fails now.
        chat = {"model": "deepseek-mock", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(base + "/v1/chat/completions", json=chat, timeout=30).status_code == 503

        procs.serve("dispatcher", "dispatcher", "--bind", dispatcher, *fleet_flags)
        wait_until(lambda: ready(base)[0] == 200, timeout=30, what="ready again")
        assert httpx.post(base + "/v1/chat/completions", json=chat, timeout=30).status_code == 200
