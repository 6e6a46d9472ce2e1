"""End to end, real processes: engines whose KV-event publishers connect to the router's
bound SUB (told apart by topic), a data-parallel engine whose prefix is routed to the rank
holding it, and a session that sticks to its engine."""

from __future__ import annotations

import json

import httpx
import openai
from e2e_stack import LOCAL, Processes, running_stack, wait_until

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


def test_engines_that_connect_their_publisher_to_the_router(tmp_path):
    """Both protocols point their publisher at the router's bound SUB with a topic naming
    the engine (its host, as pods' addresses do); the router tells them apart and indexes
    each one's blocks. The router binds first (port 0, reported), so the engines can be
    told where to connect; they join fleet through its watched workers file."""
    workers_file = tmp_path / "workers.json"
    workers_file.write_text("[]")
    with Processes() as procs:
        fleet = procs.serve(
            "fleet", "fleet", "--workers-file", str(workers_file), "--control", LOCAL,
            "--events", LOCAL, "--probe-interval", "0.5",
        )  # fmt: skip
        fleet_flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
        router = procs.serve(
            "router", "router", "--bind", LOCAL, *fleet_flags, "--kv-events-bind", LOCAL,
        )  # fmt: skip
        listen = router["kv_events_listen"]
        dispatcher = procs.serve("dispatcher", "dispatcher", "--bind", LOCAL, *fleet_flags)
        http = procs.serve(
            "preprocessor", "preprocessor", "--port", "0", "--router", router["bind"],
            "--dispatcher", dispatcher["bind"], *fleet_flags,
        )["port"]  # fmt: skip
        base = f"http://127.0.0.1:{http}"
        # Two loopback addresses stand for two pods: the default topic pattern
        # kv@{host}@{model} then names each engine before its port is known.
        engines = []
        for n, (protocol, host) in enumerate((("sglang", "127.0.0.1"), ("vllm", "127.0.0.2"))):
            argv = [
                "mock-engine", "--protocol", protocol, "--host", host, "--port", "0",
                "--kv-events-endpoint", listen,  # a named host: the engine connects
                "--kv-events-topic", f"kv@{host}@{MODEL}",
                "--kv-replay-endpoint", f"tcp://{host}:0", "--speedup", "4",
            ]  # fmt: skip
            engines.append((host, procs.start_ready(f"engine-{n}", *argv)))
        workers = []
        for host, started in engines:
            r = started.result()
            workers.append(f"grpc://{host}:{r['port']}?kv_replay={r['kv_replay']}")
        staged = workers_file.with_suffix(".tmp")
        staged.write_text(json.dumps(workers))
        staged.replace(workers_file)  # fleet sees the whole list or none
        wait_until(lambda: _status(base + "/ready") == 200, timeout=90, what="the stack")
        with openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0) as client:
            wait_until(
                lambda: len((debug_route(base, chat_body("?")) or {}).get("workers", [])) == 2,
                timeout=60,
                what="both engines routable",
            )
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


def test_engines_that_connect_learned_from_their_report():
    """Issue 32: no --kv-events-bind, no worker options. Two SGLang engines point their
    publisher at a port of the router's host with topics of their own; fleet reads that from
    their kv_events_config (a named host: by SGLang's rule the publisher connects), the
    router binds that port for them and tells them apart by the topics they report.
    /debug/kv and the dry run's rows show each worker's event stream."""
    from switchyard.common.ports import free_port

    listen = f"tcp://127.0.0.1:{free_port()}"
    with Processes() as procs:
        engines = []
        for n in range(2):
            argv = [
                "mock-engine", "--protocol", "sglang", "--port", "0",
                "--kv-events-endpoint", listen, "--kv-events-topic", f"engine-{n}",
                "--kv-replay-endpoint", "tcp://127.0.0.1:0", "--speedup", "4",
            ]  # fmt: skip
            engines.append(procs.start_ready(f"engine-{n}", *argv))
        workers = [f"grpc://127.0.0.1:{e.result()['port']}" for e in engines]
        fleet = procs.serve(
            "fleet", "fleet", *[f"--worker={w}" for w in workers], "--control", LOCAL,
            "--events", LOCAL, "--probe-interval", "0.5",
        )  # fmt: skip
        fleet_flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
        router = procs.serve("router", "router", "--bind", LOCAL, *fleet_flags)
        dispatcher = procs.serve("dispatcher", "dispatcher", "--bind", LOCAL, *fleet_flags)
        http = procs.serve(
            "preprocessor", "preprocessor", "--port", "0", "--router", router["bind"],
            "--dispatcher", dispatcher["bind"], *fleet_flags,
        )["port"]  # fmt: skip
        base = f"http://127.0.0.1:{http}"
        wait_until(lambda: _status(base + "/ready") == 200, timeout=90, what="the stack")
        with openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0) as client:
            wait_until(
                lambda: len((debug_route(base, chat_body("?")) or {}).get("workers", [])) == 2,
                timeout=60,
                what="both engines routable",
            )
            client.chat.completions.create(**chat_body("Which track for siding 70?"))
            probe = chat_body("Which track for siding 91?")
            route = wait_until(
                lambda: (
                    (r := debug_route(base, probe))
                    and (chosen_row(r) or {}).get("overlap_blocks", 0) > 0
                    and r
                ),
                timeout=60,
                what="the prefix indexed from a publisher that connects, no flags given",
            )
            row = chosen_row(route)
            assert row["kv_blocks"] > 0 and row["kv_last_seq"] >= 1 and row["kv_connected"]
            assert 0 <= row["kv_event_age_ms"] and not row["kv_suspected_stale"]
            reply = client.chat.completions.create(**probe)
            assert reply.usage.prompt_tokens_details.cached_tokens > 0
        every = httpx.get(base + "/debug/kv", timeout=10).json()
        assert len(every["workers"]) == 2
        one = httpx.get(base + "/debug/kv", params={"worker": row["url"]}, timeout=10).json()
        assert one["events"]["router_listens"] == [listen]
        assert one["events"]["topic"] in ("engine-0", "engine-1")
        assert one["index"]["device_blocks"] == row["kv_blocks"] or one["index"]["device_blocks"]
        missing = httpx.get(base + "/debug/kv", params={"worker": "grpc://nowhere:1"}, timeout=10)
        assert missing.status_code == 404
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
