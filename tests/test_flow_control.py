"""Flow control end to end (`switchyard up --flow-config`, real processes, the openai SDK):
the router's gate orders queued requests by priority, by fair shares between tenants and by
deadline; refuses with OpenAI-shaped 429s and Retry-After (queue full, a flow's cap, an
objective out of reach, at once or once queued); holds one limit for two preprocessors; and
keeps serving through a router's death (each preprocessor's own gate), the restarted router
counting what runs.

With max_running 1 and no burst, requests run one at a time: the order of their first
tokens is the order the gate admitted them. A request is known to be queued when
/debug/flow shows it, so every test drives the order it needs without timing anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest
from e2e_stack import running_stack, wait_until

MODEL = "deepseek-mock"
FLOW = {
    "max_running": 1,
    "burst": 0,
    "max_queued": 6,
    "queue_timeout_s": 30,
    "tenant_header": "x-tenant",
    "classes": {"interactive": -10, "batch": 10},
    "flows": {"gold": {"weight": 3}, "capped": {"max_requests": 1}},
}
# The mock engines run 4x fast in these stacks: 100 ms per token is 25 ms.
UP = ("--mock-engines", "sglang", "--mock-itl-ms", "100")
# A request holding the one slot while the others queue behind it: ~5 s, far longer than it
# takes to queue them (each is sent once /debug/flow shows the one before it queued).
BLOCKER = 200

pytestmark = pytest.mark.timeout(300)


def flow_file(config: dict) -> Path:
    handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(config, handle)
    handle.close()
    return Path(handle.name)


@pytest.fixture(scope="module")
def stack():
    path = flow_file(FLOW)
    try:
        with running_stack(*UP, "--flow-config", str(path)) as stack:
            yield stack
    finally:
        path.unlink()


def gate(base: str) -> dict:
    state = httpx.get(base + "/debug/flow", timeout=10).json()["deployment"]
    assert state is not None, "no router's gate answered"
    return state["state"]


def queued(base: str, n: int) -> None:
    wait_until(lambda: gate(base)["queued"] == n, 30, 0.05, f"{n} queued at the gate")


def idle(base: str) -> None:
    wait_until(
        lambda: gate(base)["running"] == 0 and gate(base)["queued"] == 0, 60, 0.1, "an idle gate"
    )


class Client:
    """Streams that record the order of their first tokens."""

    def __init__(self, base: str) -> None:
        self.http = httpx.AsyncClient(base_url=base, timeout=120)
        self.first: list[str] = []

    async def stream(self, name: str, max_tokens: int = 2, headers=None, **body) -> int:
        payload = {
            "model": MODEL, "prompt": "flow control test", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, **body,
        }  # fmt: skip
        async with self.http.stream(
            "POST", "/v1/completions", json=payload, headers=headers or {}
        ) as reply:
            if reply.status_code != 200:
                await reply.aread()
                return reply.status_code
            async for line in reply.aiter_lines():
                if line.startswith("data: {") and name not in self.first:
                    self.first.append(name)
        return 200


async def in_order(base: str, blocker_tokens: int, queued_ones: list[tuple[str, dict]]):
    """A blocker holds the one slot; each of `queued_ones` is sent once the one before it is
    queued; returns (the order of first tokens after the blocker's, every status)."""
    client = Client(base)
    try:
        blocker = asyncio.create_task(client.stream("blocker", blocker_tokens))
        await asyncio.to_thread(
            wait_until, lambda: gate(base)["running"] == 1, 30, 0.05, "the blocker running"
        )
        tasks = [blocker]
        for n, (name, kw) in enumerate(queued_ones):
            tasks.append(asyncio.create_task(client.stream(name, **kw)))
            await asyncio.to_thread(queued, base, n + 1)
        statuses = await asyncio.gather(*tasks)
        return client.first[1:], statuses
    finally:
        await client.http.aclose()


class TestOrder:
    def test_most_urgent_band_first(self, stack):
        base = stack.base_url
        idle(base)
        order, statuses = asyncio.run(
            in_order(
                base,
                BLOCKER,
                [
                    ("batch", {"headers": {"x-priority": "batch"}}),
                    ("normal", {}),
                    ("urgent", {"priority": -10}),  # vLLM's body field
                    ("interactive", {"headers": {"x-priority": "interactive"}}),
                ],
            )
        )
        assert set(statuses) == {200}
        assert order == ["urgent", "interactive", "normal", "batch"]

    def test_deadline_order_within_a_flow(self, stack):
        base = stack.base_url
        idle(base)
        order, statuses = asyncio.run(
            in_order(
                base,
                BLOCKER,
                [
                    ("none", {}),
                    ("loose", {"headers": {"x-ttft-objective-ms": "60000"}}),
                    ("tight", {"headers": {"x-ttft-objective-ms": "30000"}}),
                ],
            )
        )
        assert set(statuses) == {200}
        assert order == ["tight", "loose", "none"]


class TestFairness:
    def test_weighted_shares_between_tenants(self, stack):
        """Three requests of `big` (weight 1) queued before three of `gold` (weight 3): while
        both wait, gold gets three for each of big's, where arrival order would serve big's
        three first. (Six: the queue's size, max_queued.)"""
        base = stack.base_url
        idle(base)
        big = [(f"big{i}", {"headers": {"x-tenant": "big"}}) for i in range(3)]
        gold = [(f"gold{i}", {"headers": {"x-tenant": "gold"}}) for i in range(3)]
        order, statuses = asyncio.run(in_order(base, BLOCKER, big + gold))
        assert set(statuses) == {200}
        # Start-time fair queuing in tokens (equal costs c): big0 starts at V and finishes
        # at V + c; gold's three start at V, V + c/3, V + 2c/3, all before big1 at V + c.
        assert order == ["big0", "gold0", "gold1", "gold2", "big1", "big2"], order


class TestRefusals:
    @staticmethod
    def complete(base: str, **kw):
        """One completion through the openai SDK (its client closed after)."""
        with openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0) as client:
            return client.completions.create(model=MODEL, **kw)

    def warm(self, base: str) -> None:
        """Short requests: the gate's recent mean run time is short (it weighs each new one
        a tenth), so it expects a busy slot to free soon."""
        with openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0) as client:
            for _ in range(20):
                client.completions.create(model=MODEL, prompt="warm", max_tokens=2)

    def test_an_objective_out_of_reach_is_refused_at_once(self, stack):
        """Three interactive requests queued ahead of it and one running: the gate predicts
        a wait of at least four run times (its recent mean), and refuses on arrival an
        objective of two."""
        base = stack.base_url
        idle(base)
        self.complete(base, prompt="warm", max_tokens=2)  # the gate has a mean run time

        async def scenario():
            client = Client(base)
            try:
                tasks = [asyncio.create_task(client.stream("blocker", BLOCKER))]
                await asyncio.to_thread(
                    wait_until, lambda: gate(base)["running"] == 1, 30, 0.05, "the blocker"
                )
                urgent = {"x-priority": "interactive"}
                for n in range(3):
                    tasks.append(asyncio.create_task(client.stream(f"q{n}", 40, urgent)))
                    await asyncio.to_thread(queued, base, n + 1)
                mean = (await asyncio.to_thread(gate, base))["mean_run_s"]
                objective_ms = max(1, int(2 * mean * 1e3))
                started = time.monotonic()
                with pytest.raises(openai.RateLimitError) as refused:
                    await asyncio.to_thread(
                        self.complete,
                        base,
                        prompt="in a hurry",
                        max_tokens=2,
                        extra_headers={"x-ttft-objective-ms": str(objective_ms)},
                    )
                answered_in = time.monotonic() - started
                assert await asyncio.gather(*tasks) == [200] * 4
                return refused.value, answered_in, objective_ms
            finally:
                await client.http.aclose()

        err, answered_in, objective_ms = asyncio.run(scenario())
        assert err.status_code == 429 and err.code == "ttft_objective_unattainable"
        assert err.type == "rate_limit_error"
        # The objective less the time the request took to reach the gate.
        left = re.search(r"exceeds the (\d+) ms left of the request's TTFT objective", err.message)
        assert left is not None, err.message
        assert objective_ms - 1000 < int(left.group(1)) <= objective_ms
        assert int(err.response.headers["retry-after"]) >= 1
        # Refused on arrival: long before the blocker (5 s) and the three queued (1 s each)
        # could run.
        assert answered_in < 3.0

    def test_a_queued_request_is_refused_once_its_objective_is_out_of_reach(self, stack):
        base = stack.base_url
        idle(base)
        self.warm(base)  # short runs: at first the gate expects the slot free soon

        async def scenario():
            client = Client(base)
            try:
                blocker = asyncio.create_task(client.stream("blocker", BLOCKER))
                await asyncio.to_thread(
                    wait_until, lambda: gate(base)["running"] == 1, 30, 0.05, "the blocker"
                )
                reply = await client.http.post(
                    "/v1/completions",
                    json={"model": MODEL, "prompt": "x", "max_tokens": 2},
                    headers={"x-ttft-objective-ms": "2000"},
                )
                assert await blocker == 200
                return reply
            finally:
                await client.http.aclose()

        reply = asyncio.run(scenario())
        assert reply.status_code == 429, reply.text
        error = reply.json()["error"]
        assert error["code"] == "ttft_objective_unattainable"
        assert "waited" in error["message"] and "retry-after" in reply.headers

    def test_queue_full_and_a_flows_cap(self, stack):
        base = stack.base_url
        idle(base)

        async def scenario():
            client = Client(base)
            try:
                tasks = [asyncio.create_task(client.stream("blocker", BLOCKER))]
                await asyncio.to_thread(
                    wait_until, lambda: gate(base)["running"] == 1, 30, 0.05, "the blocker"
                )
                tasks.append(
                    asyncio.create_task(client.stream("capped", headers={"x-tenant": "capped"}))
                )
                await asyncio.to_thread(queued, base, 1)
                second = await client.stream("capped2", headers={"x-tenant": "capped"})
                for n in range(5):
                    tasks.append(asyncio.create_task(client.stream(f"q{n}")))
                    await asyncio.to_thread(queued, base, n + 2)
                return second, await asyncio.gather(*tasks)
            finally:
                await client.http.aclose()

        capped_status, statuses = asyncio.run(scenario())
        assert capped_status == 429
        assert set(statuses) == {200}
        # The queue held 6: one more is refused at once (while the blocker runs).
        client = Client(base)

        async def one_more():
            tasks = [asyncio.create_task(client.stream("blocker", BLOCKER))]
            await asyncio.to_thread(
                wait_until, lambda: gate(base)["running"] == 1, 30, 0.05, "the blocker"
            )
            for n in range(6):
                tasks.append(asyncio.create_task(client.stream(f"q{n}")))
                await asyncio.to_thread(queued, base, n + 1)
            with pytest.raises(openai.RateLimitError) as refused:
                await asyncio.to_thread(self.complete, base, prompt="x", max_tokens=2)
            await asyncio.gather(*tasks)
            await client.http.aclose()
            return refused.value

        err = asyncio.run(one_more())
        assert err.code == "rate_limit_exceeded" and "at capacity" in err.message
        assert int(err.response.headers["retry-after"]) >= 1

    def test_metrics(self, stack):
        text = httpx.get(stack.base_url + "/metrics", timeout=10).text
        refused = "switchyard_preprocessor_flow_refused_total"
        assert sample(text, refused, flow="default", reason="queue_full") >= 1
        assert sample(text, refused, flow="capped", reason="flow_limit") == 1
        assert sample(text, refused, flow="default", reason="ttft_objective") == 2
        assert sample(text, "switchyard_preprocessor_flow_wait_seconds_count", flow="gold") == 3
        router = stack.report()["children"]["router-0"]["metrics_port"]
        text = httpx.get(f"http://127.0.0.1:{router}/metrics", timeout=10).text
        assert sample(text, "switchyard_router_flow_admitted_total", flow="gold") == 3
        shed = "switchyard_router_flow_shed_total"
        assert sample(text, shed, flow="default", reason="ttft_objective") == 2
        assert sample(text, shed, flow="capped", reason="flow_limit") == 1
        assert sample(text, "switchyard_router_flow_peers") == 1


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of the series of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"{name}(?:{{(.*)}})? (\S+)$", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def test_one_limit_for_two_preprocessors_and_a_router_that_dies():
    """Two preprocessors, one gate: never more than max_running at once anywhere. The
    router SIGKILLed with requests queued at it: they run through each preprocessor's own
    gate; the restarted router takes over and counts what runs."""
    config = {**FLOW, "max_running": 2, "max_queued": 64}
    path = flow_file(config)
    try:
        with running_stack(*UP, "--preprocessors", "2", "--flow-config", str(path)) as stack:
            base = stack.base_url

            async def load(n: int, tokens: int) -> list[int]:
                client = Client(base)
                try:
                    return list(
                        await asyncio.gather(*(client.stream(f"r{i}", tokens) for i in range(n)))
                    )
                finally:
                    await client.http.aclose()

            async def watched() -> tuple[list[int], int, int]:
                task = asyncio.create_task(load(12, 40))
                most = peers = 0
                while not task.done():
                    state = await asyncio.to_thread(gate, base)
                    most = max(most, state["running_units"])
                    peers = max(peers, state["peers"])
                    await asyncio.sleep(0.05)
                return await task, most, peers

            statuses, most, peers = asyncio.run(watched())
            assert set(statuses) == {200}
            assert most <= 2 and peers == 2

            router = stack.pid("router-0")

            async def killed() -> list[int]:
                task = asyncio.create_task(load(8, BLOCKER))
                await asyncio.to_thread(queued, base, 6)
                os.kill(router, signal.SIGKILL)
                # The queued six fail over to the preprocessors' own gates; up restarts the
                # router, which learns from both preprocessors what runs.
                await asyncio.to_thread(
                    wait_until, lambda: stack.pid("router-0") != router, 60, 0.2, "a new router"
                )
                # One reading per check: the two preprocessors share the port, and the one
                # that answers may not have reconnected to the new router yet.
                state = await asyncio.to_thread(
                    wait_until,
                    lambda: (d := _flow(base)["deployment"]) and d["state"]["peers"] == 2 and d,
                    60,
                    0.2,
                    "the new router's gate hearing both preprocessors",
                )
                return [state["state"]["running_units"], *(await task)]

            adopted, *statuses = asyncio.run(killed())
            assert set(statuses) == {200}
            assert adopted >= 1  # what the preprocessors' own gates admitted, counted
            locally = 0.0
            for name in ("preprocessor-0", "preprocessor-1"):
                port = stack.report()["children"][name]["metrics_port"]
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
                locally += sample(text, "switchyard_preprocessor_flow_local_admissions_total")
            assert locally == 6
            # Requests go through the new router's gate again.
            assert set(asyncio.run(load(4, 4))) == {200}
            router = stack.report()["children"]["router-0"]["bind"]
            # A preprocessor goes back to the router's gate once it sees it live again.
            wait_until(
                lambda: _flow(base)["preprocessor"]["gate"] == router,
                timeout=30,
                what="the preprocessor back on the router's gate",
            )
    finally:
        path.unlink()


def _flow(base: str) -> dict:
    return httpx.get(base + "/debug/flow", timeout=10).json()
