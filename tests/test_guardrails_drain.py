"""The admin API while streams run: drain, remove and add engines under 32 concurrent streams.

No stream fails, and every output is token for token the undisturbed run's (the mock engines
are deterministic per context, so a stream resent elsewhere with its tokens so far goes on
identically). A drained engine takes no new request; streams of a removed engine that run past
--drain-timeout move on at once (the preprocessor's idle and gap timeouts are set far beyond
the test's own timeout here, so a stream left to stall could not finish in time).
"""

from __future__ import annotations

import asyncio
import re

import httpx
import openai
import pytest
from e2e_stack import LOCAL, Processes, http_status, wait_until

MODEL = "deepseek-mock"
STREAMS = 32
DRAIN_TIMEOUT = 1.0


def engine_argv(protocol: str) -> list[str]:
    return [
        "mock-engine", "--protocol", protocol, "--port", "0", "--itl-ms", "25", "--ttft-ms", "5",
        "--metrics-port", "0",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def stack():
    with Processes() as procs:
        pending = {
            f"engine-{n}": procs.start_ready(f"engine-{n}", *engine_argv(p))
            for n, p in enumerate(("vllm", "sglang", "vllm"))
        }
        engines = {name: ready.result() for name, ready in pending.items()}
        urls = {name: f"grpc://127.0.0.1:{r['port']}" for name, r in engines.items()}
        fleet = procs.serve(
            "fleet", "fleet", "--control", LOCAL, "--events", LOCAL, "--probe-interval", "0.5",
            "--worker", urls["engine-0"], "--worker", urls["engine-1"],
        )  # fmt: skip
        flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
        router = procs.serve("router", "router", "--bind", LOCAL, *flags)["bind"]
        dispatcher = procs.serve(
            "dispatcher", "dispatcher", "--bind", LOCAL, *flags,
            "--drain-timeout", str(DRAIN_TIMEOUT),
        )["bind"]  # fmt: skip
        port = procs.serve(
            "preprocessor", "preprocessor", "--port", "0", *flags,
            "--router", router, "--dispatcher", dispatcher,
            "--stream-idle-timeout", "900", "--stream-gap-timeout", "900",
        )["port"]  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: len(ready_workers(base)) == 2, timeout=60, what="two engines ready")
        wait_until(lambda: http_status(base + "/ready") == 200, timeout=60, what="/ready")
        yield procs, base, urls, engines


def admin(base: str, method: str, path: str, body=None) -> httpx.Response:
    return httpx.request(method, f"{base}/admin/workers{path}", json=body, timeout=30)


def workers(base: str) -> dict[str, dict]:
    reply = admin(base, "GET", "")
    return {w["url"]: w for w in reply.json()["data"]} if reply.status_code == 200 else {}


def ready_workers(base: str) -> set[str]:
    return {url for url, w in workers(base).items() if w["state"] == "ready"}


def engine_requests(engine: dict) -> int:
    text = httpx.get(f"http://127.0.0.1:{engine['metrics_port']}/metrics", timeout=5).text
    return int(float(re.search(r"^switchyard_mock_engine_requests_total (\S+)$", text, re.M)[1]))


async def one_stream(client, n: int, tokens: int, started: list[int], all_started) -> tuple:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Stream {n}: the yard at dawn, {n * 7} wagons."}],
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    parts, finish, usage, first = [], None, None, True
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
                if first:
                    first = False
                    started[0] += 1
                    if started[0] == STREAMS:
                        all_started.set()
            finish = choice.finish_reason or finish
    return "".join(parts), finish, usage.completion_tokens if usage else -1


def run_streams(base: str, tokens: int, disturb=None) -> list[tuple]:
    """32 concurrent streams; `disturb()` runs (in a thread) once each has its first token."""

    async def main() -> list[tuple]:
        started, all_started = [0], asyncio.Event()
        async with openai.AsyncOpenAI(
            base_url=base + "/v1", api_key="none", max_retries=0, timeout=120
        ) as client:
            tasks = [
                asyncio.create_task(one_stream(client, n, tokens, started, all_started))
                for n in range(STREAMS)
            ]
            if disturb is not None:
                await asyncio.wait_for(all_started.wait(), 60)
                await asyncio.to_thread(disturb)
            return await asyncio.gather(*tasks)

    return asyncio.run(main())


def check(expected: list[tuple], got: list[tuple], tokens: int) -> None:
    for n, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"stream {n} differs"
        assert have[1] == "length" and have[2] == tokens


class TestAdminUnderLoad:
    def test_drain_takes_no_new_requests_and_streams_finish(self, stack):
        procs, base, urls, engines = stack
        calm = run_streams(base, 40)
        drained = workers(base)[urls["engine-0"]]["instance_id"]

        def drain() -> None:
            reply = admin(base, "POST", f"/{drained}/drain")
            assert reply.status_code == 200 and reply.json()["worker"]["state"] == "draining"

        check(calm, run_streams(base, 40, drain), 40)
        before = engine_requests(engines["engine-0"])
        check(calm, run_streams(base, 40), 40)  # everything on the other engine now
        assert engine_requests(engines["engine-0"]) == before
        assert admin(base, "POST", f"/{drained}/resume").status_code == 200
        wait_until(lambda: len(ready_workers(base)) == 2, timeout=30, what="resumed")

    def test_add_then_remove_mid_stream(self, stack):
        procs, base, urls, engines = stack
        tokens = 160  # streams last several times the drain timeout
        calm = run_streams(base, tokens)

        def add() -> None:
            reply = admin(base, "POST", "", {"url": urls["engine-2"]})
            assert reply.status_code == 201, reply.text

        check(calm, run_streams(base, tokens, add), tokens)
        wait_until(lambda: len(ready_workers(base)) == 3, timeout=30, what="added engine ready")
        added = workers(base)[urls["engine-2"]]
        assert added["source"] == "admin" and added["learned"]["protocol"] == "vllm"
        before = engine_requests(engines["engine-2"])

        def remove() -> None:
            assert admin(base, "DELETE", f"/{added['instance_id']}").status_code == 200

        check(calm, run_streams(base, tokens, remove), tokens)
        assert engine_requests(engines["engine-2"]) > before  # it had streams to move
        log = procs.log("dispatcher")
        assert "past the drain timeout" in log or "after the drain timeout" in log
        assert urls["engine-2"] not in workers(base)

    def test_flag_workers_cannot_be_removed_only_drained(self, stack):
        procs, base, urls, engines = stack
        iid = workers(base)[urls["engine-1"]]["instance_id"]
        reply = admin(base, "DELETE", f"/{iid}")
        assert reply.status_code == 409 and "flag" in reply.json()["error"]["message"]
        assert admin(base, "POST", "/12345/drain").status_code == 404
        assert admin(base, "POST", "", {"url": "nonsense ::"}).status_code == 400
        assert admin(base, "POST", "", {"url": urls["engine-1"]}).status_code == 409
