"""Chaos: an engine that refuses some calls with UNAVAILABLE stays in rotation.

Regression (QA: one UNAVAILABLE answer to one call took a whole engine out of rotation, and
with two engines refusing 5% of calls about half the client requests got 503
no_engine_available). An engine's own UNAVAILABLE refuses that one call: the request moves to
the other engine, every client request succeeds, and the refusing engine is never reported
down, so both engines keep serving.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import openai
from e2e_stack import LOCAL, Processes, running_stack, wait_until

from switchyard.common.workers import worker_flag

MODEL = "deepseek-mock"
REQUESTS = 64
CONCURRENCY = 8
# --fault-seed 57 draws a refusal for the faulty engine's Generate calls 1, 3 and 10 (of its
# first 40) at a 5% rate: every run refuses early and more than once.
FAULTY = ["--fail-unavailable", "0.05", "--fault-seed", "57"]


def start_engine(procs: Processes, name: str, *extra: str) -> str:
    """A mock SGLang engine on free ports; its --worker flag."""
    ready = procs.serve(
        name,
        "mock-engine",
        "--protocol",
        "sglang",
        "--port",
        "0",
        "--ttft-ms",
        "5",
        "--itl-ms",
        "10",
        "--kv-events-endpoint",
        LOCAL,
        "--kv-replay-endpoint",
        LOCAL,
        "--log-requests",
        *extra,
    )
    url = f"grpc://127.0.0.1:{ready['port']}"
    return worker_flag(url, kv_events=ready["kv_events"], kv_replay=ready["kv_replay"])


def routable(base: str) -> int:
    """How many workers the router would consider now (a dry-run route)."""
    try:
        reply = httpx.post(base + "/debug/route", json={"model": MODEL, "prompt": "x"}, timeout=5)
    except httpx.HTTPError:
        return 0
    return len(reply.json()["workers"]) if reply.status_code == 200 else 0


async def load(base: str) -> tuple[list[str], list[int]]:
    """REQUESTS chat requests, CONCURRENCY at a time: the failures, and the routable worker
    counts seen while they ran (polled every 20 ms)."""
    failures: list[str] = []
    seen: list[int] = []
    done = asyncio.Event()
    gate = asyncio.Semaphore(CONCURRENCY)
    async with openai.AsyncOpenAI(
        base_url=base + "/v1", api_key="none", max_retries=0, timeout=30
    ) as client:

        async def one(n: int) -> None:
            async with gate:
                try:
                    reply = await client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"Shunt wagon {n} to track {n}."}],
                        max_tokens=8,
                        temperature=0,
                        extra_body={"ignore_eos": True},
                    )
                    assert reply.choices[0].finish_reason == "length"
                except (openai.APIError, AssertionError) as exc:
                    failures.append(f"request {n}: {exc!r}")

        async def watch() -> None:
            async with httpx.AsyncClient(timeout=5) as http:
                while not done.is_set():
                    try:
                        reply = await http.post(
                            base + "/debug/route", json={"model": MODEL, "prompt": "x"}
                        )
                        seen.append(len(reply.json()["workers"]) if reply.is_success else 0)
                    except httpx.HTTPError:
                        seen.append(0)
                    await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(one(n) for n in range(REQUESTS)))
        done.set()
        await watcher
    return failures, seen


def test_an_engine_refusing_some_calls_stays_in_rotation():
    with Processes() as procs:
        workers = [
            start_engine(procs, "engine-faulty", *FAULTY),
            start_engine(procs, "engine-sound"),
        ]
        with running_stack("--worker", workers[0], "--worker", workers[1]) as stack:
            wait_until(lambda: routable(stack.base_url) == 2, timeout=30, what="both engines")
            failures, seen = asyncio.run(load(stack.base_url))
            log = stack.log()
        calls = {
            name: len(re.findall(r"Generate request_id=", procs.log(name)))
            for name in ("engine-faulty", "engine-sound")
        }

    assert failures == [], failures[:5]
    # The engine that refused calls was never reported down nor left the rotation ...
    downs = [
        line
        for line in log.splitlines()
        if "reporting instance down" in line or "instance reported down" in line
    ]
    assert downs == [], downs[:3]
    assert seen and min(seen) == 2, seen
    # ... its refused calls were migrated (the seed refuses its first call) ...
    migrated = re.findall(r"migrating request_id=\S+ from instance_id=\d+ kind=(\w+)", log)
    assert "refused" in migrated and set(migrated) == {"refused"}, migrated
    # ... and both engines kept serving: each took a fair share of the calls.
    assert min(calls.values()) >= REQUESTS // 4, calls
