"""The `admit` stage on a preprocessor's own gate (no router connected): who a request is,
its priority and objective, the 429s (OpenAI-shaped, Retry-After, the gate's reason), and
the release of its units whatever happens; without flow control, what would be dropped is
refused."""

from __future__ import annotations

import dataclasses
import hashlib
import types

import pytest

from switchyard.common.flow.bands import Ticket
from switchyard.common.flow.config import from_mapping
from switchyard.preprocessor.flow_client import FlowClient
from switchyard.preprocessor.stages import endpoints
from switchyard.preprocessor.stages.context import CHAT, COMPLETIONS
from switchyard.preprocessor.stages.tests.fakes import (
    MODEL,
    FakeDispatcher,
    FakeHttp,
    FakeRouter,
    chat_body,
    deps,
    done,
    tokens,
)

pytestmark = pytest.mark.timeout(30)
KEY = hashlib.sha256(b"sk-acme").digest()


class NoRouter:
    """A router channel with no router connected: the preprocessor's own gate decides."""

    replicas = types.SimpleNamespace(live=())

    def flow_leader(self):
        return None


def flow_deps(bundle, **raw):
    config = from_mapping({"max_running": 1, "burst": 0, **raw})
    client = FlowClient(config, NoRouter(), "test")  # type: ignore[arg-type]
    d = deps(
        bundle,
        FakeRouter([1]),
        FakeDispatcher(lambda r: [tokens(r.request_id, 5, 6), done(r.request_id)]),
    )
    return dataclasses.replace(d, flow=client), client


async def run(d, body: bytes, headers=(), key: bytes | None = None, endpoint: str = CHAT):
    http = FakeHttp()
    tenant = key.hex() if key is not None else ""
    ctx = endpoints.new_request(d, endpoint, http, tenant=tenant, headers=list(headers))
    return await endpoints.serve(ctx, body), http


class TestWithoutFlowControl:
    async def test_what_could_not_take_effect_is_refused(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(lambda r: [done(r.request_id)]))
        status, http = await run(d, chat_body(priority=3))
        assert status == 400 and http.json()["error"]["param"] == "priority"
        status, http = await run(d, chat_body(), [(b"x-priority", b"1")])
        assert status == 400 and http.json()["error"]["param"] == "x-priority"
        status, http = await run(d, chat_body(), [(b"x-ttft-objective-ms", b"100")])
        assert status == 400 and http.json()["error"]["param"] == "x-ttft-objective-ms"

    async def test_priority_zero_is_the_neutral_value(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(lambda r: [done(r.request_id)]))
        assert (await run(d, chat_body(priority=0)))[0] == 200


class TestAdmission:
    async def test_admitted_then_released(self, bundle):
        d, client = flow_deps(bundle)
        status, _ = await run(d, chat_body())
        assert status == 200
        assert client.local_admissions == 1 and client.held == {}
        assert client.gate.running == 0 and client.gate.admitted[("default", "default")] == 1

    async def test_queue_full_is_a_429_with_retry_after(self, bundle):
        d, client = flow_deps(bundle, max_queued=0)
        client.gate.offer(Ticket("busy", "default"), 0.0)  # the one slot is taken
        status, http = await run(d, chat_body())
        assert status == 429
        error = http.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
        assert "at capacity" in error["message"]
        assert int(http.headers[b"retry-after"]) >= 1
        assert d.metrics.flow_refused.labels("default", "default", "queue_full")._value.get() == 1

    async def test_an_unreachable_objective_is_refused_at_once(self, bundle):
        d, client = flow_deps(bundle)
        client.gate.offer(Ticket("busy", "default"), 0.0)
        client.gate.mean_run_s = 10.0  # the slot frees in about 10 s
        status, http = await run(d, chat_body(), [(b"x-ttft-objective-ms", b"500")])
        assert status == 429
        error = http.json()["error"]
        assert error["code"] == "ttft_objective_unattainable"
        assert "left of the request's TTFT objective" in error["message"]
        assert b"retry-after" in http.headers
        assert client.gate.queued == 0

    async def test_units_and_cost(self, bundle):
        d, client = flow_deps(bundle, max_running=100)
        offered: list[Ticket] = []
        offer = client.gate.offer
        client.gate.offer = lambda t, now: offered.append(t) or offer(t, now)  # type: ignore[method-assign]
        body = b'{"model": "m", "prompt": ["a b", "c d e"], "max_tokens": 4}'
        status, _ = await run(d, body, endpoint=COMPLETIONS)
        assert status == 200
        [ticket] = offered
        assert ticket.units == 2  # a sequence per prompt (and per choice, with n)
        assert ticket.cost > 2 * 4  # the prompts' tokens plus 4 tokens per sequence


class TestWhoAndWhat:
    def offered(self, client) -> list[Ticket]:
        seen: list[Ticket] = []
        offer = client.gate.offer

        def spy(ticket: Ticket, now: float):
            seen.append(ticket)
            return offer(ticket, now)

        client.gate.offer = spy
        return seen

    async def test_flows(self, bundle):
        digest = KEY.hex()
        d, client = flow_deps(
            bundle,
            tenant_header="x-tenant",
            flows={"acme": {}},
            keys={digest: "acme"},
        )
        seen = self.offered(client)
        await run(d, chat_body(), key=KEY)
        await run(d, chat_body(), key=hashlib.sha256(b"sk-other").digest())
        await run(d, chat_body(), [(b"x-tenant", b"team-7")], key=KEY)
        await run(d, chat_body())
        other = "key:" + hashlib.sha256(b"sk-other").hexdigest()[:12]
        assert [t.flow for t in seen] == ["acme", other, "team-7", "default"]

    async def test_priority_sources(self, bundle):
        d, client = flow_deps(
            bundle,
            classes={"batch": 10, "ui": -5},
            default_priority="batch",
            flows={"acme": {"priority": "ui"}},
            tenant_header="x-tenant",
        )
        seen = self.offered(client)
        await run(d, chat_body())  # the file's default
        await run(d, chat_body(), [(b"x-tenant", b"acme")])  # the flow's
        await run(d, chat_body(), [(b"x-tenant", b"acme"), (b"x-priority", b"batch")])
        await run(d, chat_body(priority=3), [(b"x-priority", b"batch")])  # the body's first
        assert [t.priority for t in seen] == [10, -5, 10, 3]

    async def test_more_urgent_than_allowed_is_a_400(self, bundle):
        d, _ = flow_deps(bundle, flows={"default": {"min_priority": 0}})
        status, http = await run(d, chat_body(priority=-1))
        assert status == 400
        assert http.json()["error"]["param"] == "priority"
        status, http = await run(d, chat_body(), [(b"x-priority", b"-1")])
        assert status == 400 and http.json()["error"]["param"] == "x-priority"

    @pytest.mark.parametrize(
        ("header", "value"),
        [(b"x-ttft-objective-ms", b"0"), (b"x-ttft-objective-ms", b"soon"), (b"x-priority", b"x")],
    )
    async def test_bad_headers(self, bundle, header, value):
        d, _ = flow_deps(bundle)
        status, http = await run(d, chat_body(), [(header, value)])
        assert status == 400 and http.json()["error"]["param"] == header.decode()

    async def test_a_bad_tenant_name(self, bundle):
        d, _ = flow_deps(bundle, tenant_header="x-tenant")
        status, http = await run(d, chat_body(), [(b"x-tenant", b"a tenant")])
        assert status == 400 and http.json()["error"]["param"] == "x-tenant"

    async def test_the_objective_is_sent_with_the_prompt(self, bundle):
        d, client = flow_deps(bundle, flows={"default": {"ttft_objective_ms": 900}})
        seen = self.offered(client)
        await run(d, chat_body())
        [ticket] = seen
        assert 0.85 < ticket.objective_s <= 0.9  # what is left of it when it reaches the gate


async def test_the_model_is_known(bundle):
    d, _ = flow_deps(bundle)
    status, http = await run(d, chat_body(model="nope"))
    assert status == 404 and MODEL != "nope"  # refused before the gate: nothing held
