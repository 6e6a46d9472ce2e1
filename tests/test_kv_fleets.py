"""End to end, real processes: engines whose KV-event publishers connect to the router's
bound SUB (told apart by topic), a data-parallel engine whose prefix is routed to the rank
holding it, and a session that sticks to its engine."""

from __future__ import annotations

import httpx
import openai
from e2e_stack import Processes, free_port, running_stack, wait_until

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


def debug_route(base_url: str, body: dict, headers: dict | None = None) -> dict | None:
    try:
        reply = httpx.post(base_url + "/debug/route", json=body, headers=headers, timeout=10)
    except httpx.HTTPError:
        return None
    return reply.json() if reply.status_code == 200 else None


def chosen_row(route: dict | None) -> dict | None:
    if route is None:
        return None
    chosen = route["chosen"]
    return next(
        (
            w
            for w in route["workers"]
            if w["instance_id"] == chosen["instance_id"] and w["dp_rank"] == chosen["dp_rank"]
        ),
        None,
    )


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def test_engines_that_connect_their_publisher_to_the_router():
    """Both protocols point their publisher at the router's bound SUB with a topic naming
    the engine; the router tells them apart and indexes each one's blocks."""
    listen, http = free_port(), free_port()
    control, fleet_events, router, dispatcher = (f"tcp://127.0.0.1:{free_port()}" for _ in range(4))
    fleet_flags = ["--fleet-control", control, "--fleet-events", fleet_events]
    base = f"http://127.0.0.1:{http}"
    with Processes() as procs:
        workers = []
        for n, protocol in enumerate(("sglang", "vllm")):
            port, replay = free_port(), free_port()
            procs.start(
                f"engine-{n}",
                "mock-engine",
                "--protocol",
                protocol,
                "--port",
                str(port),
                "--kv-events-endpoint",
                f"tcp://127.0.0.1:{listen}",  # a named host: the engine connects
                "--kv-events-topic",
                f"kv@127.0.0.1:{port}@{MODEL}",
                "--kv-replay-endpoint",
                f"tcp://*:{replay}",
                "--speedup",
                "4",
            )
            workers += ["--worker", f"grpc://127.0.0.1:{port}?kv_replay=tcp://127.0.0.1:{replay}"]
        procs.start(
            "fleet", "fleet", *workers, "--control", control, "--events", fleet_events,
            "--probe-interval", "0.5",
        )  # fmt: skip
        procs.start(
            "router", "router", "--bind", router, *fleet_flags,
            "--kv-events-bind", f"tcp://127.0.0.1:{listen}",
            "--kv-topic-pattern", "kv@{host}:{port}@{model}",
        )  # fmt: skip
        procs.start("dispatcher", "dispatcher", "--bind", dispatcher, *fleet_flags)
        procs.start(
            "preprocessor", "preprocessor", "--port", str(http), "--router", router,
            "--dispatcher", dispatcher, *fleet_flags,
        )  # fmt: skip
        wait_until(lambda: _status(base + "/ready") == 200, timeout=90, what="the stack")
        with openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0) as client:
            client.chat.completions.create(**chat_body("Which track for siding 70?"))
            probe = chat_body("Which track for siding 91?")
            route = wait_until(
                lambda: (
                    (r := debug_route(base, probe))
                    and len(r["workers"]) == 2
                    and (chosen_row(r) or {}).get("overlap_blocks", 0) > 0
                    and r
                ),
                timeout=60,
                what="the prefix indexed from a publisher that connects",
            )
            holder = route["chosen"]["instance_id"]
            reply = client.chat.completions.create(**probe)
            assert reply.usage.prompt_tokens_details.cached_tokens > 0
            assert debug_route(base, probe)["chosen"]["instance_id"] == holder
        assert "name no known worker" not in procs.log("router")


def test_a_prefix_on_rank_1_is_routed_to_rank_1():
    """A data-parallel engine (2 ranks, one cache each): follow-ups go to the rank holding
    their prefix, pinned with data_parallel_rank, and the engine serves them from cache."""
    with (
        running_stack(
            "--mock-engines", "vllm", "--mock-arg=--dp-size=2", "--mock-speedup", "4"
        ) as stack,
        openai.OpenAI(base_url=stack.base_url + "/v1", api_key="none", max_retries=0) as client,
    ):
        client.chat.completions.create(**chat_body("Which track for siding 70?"))
        probe = chat_body("Which track for siding 91?")
        route = wait_until(
            lambda: (
                (r := debug_route(stack.base_url, probe))
                and len(r["workers"]) == 2
                and (chosen_row(r) or {}).get("overlap_blocks", 0) > 0
                and r
            ),
            timeout=60,
            what="the prefix indexed on one rank",
        )
        rank = route["chosen"]["dp_rank"]
        ranks = {w["dp_rank"]: w["overlap_blocks"] for w in route["workers"]}
        assert ranks[1 - rank] == 0  # the other rank's cache does not hold it
        for n in range(4):
            body = chat_body(f"Which track for siding {n * 13}?")
            assert debug_route(stack.base_url, body)["chosen"]["dp_rank"] == rank
            reply = client.chat.completions.create(**body)
            assert reply.usage.prompt_tokens_details.cached_tokens >= ranks[rank] * 16


def test_a_session_sticks_to_its_engine():
    with running_stack("--mock-engines", "sglang,vllm,sglang", "--mock-speedup", "4") as stack:
        headers = {"x-session-id": "conversation-7"}
        seen = set()
        for n in range(5):  # unrelated prompts: only the session ties them together
            body = {
                "model": MODEL,
                "max_tokens": 2,
                "messages": [{"role": "user", "content": f"Question {n * 977} of many?"}],
            }
            reply = httpx.post(
                stack.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=30
            )
            assert reply.status_code == 200
            route = debug_route(stack.base_url, body, headers)
            seen.add(route["chosen"]["instance_id"])
            row = chosen_row(route)
            assert row["scores"]["session_affinity"] == 1.0
        assert len(seen) == 1
