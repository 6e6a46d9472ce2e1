"""A field only some engines can honour (`seed`): required of the route when some engine of
the model can honour it, a 400 naming it only when none can; migrations keep asking for it;
/debug/route shows it."""

from __future__ import annotations

import dataclasses

import pytest

from switchyard.preprocessor.catalog import ModelEntry, build_catalog
from switchyard.preprocessor.stages.context import CHAT
from switchyard.preprocessor.stages.tests.fakes import (
    MODEL,
    FakeDispatcher,
    FakeHttp,
    FakeRouter,
    chat_body,
    deps,
    done,
    failed,
    serve,
    tokens,
)
from switchyard.protos.messages import Instance

pytestmark = pytest.mark.timeout(30)


def with_capabilities(d, capabilities: frozenset[str]):
    entry = ModelEntry(MODEL, 4096, 2, capabilities=capabilities)
    return dataclasses.replace(d, catalog=lambda: {MODEL: entry})


async def run(d, body: bytes) -> tuple[int, FakeHttp]:
    http = FakeHttp()
    return await serve(d, CHAT, body, http), http


class TestSeed:
    async def test_routed_to_engines_that_can_honour_it(self, bundle):
        router = FakeRouter([1])
        d = with_capabilities(
            deps(
                bundle,
                router,
                FakeDispatcher(lambda r: [tokens(r.request_id, 5), done(r.request_id)]),
            ),
            frozenset({"seed"}),
        )
        status, http = await run(d, chat_body(seed=7))
        assert status == 200, http.body
        assert router.requests[0].requires == ["seed"]

    async def test_no_need_without_a_seed(self, bundle):
        router = FakeRouter([1])
        d = with_capabilities(
            deps(
                bundle,
                router,
                FakeDispatcher(lambda r: [tokens(r.request_id, 5), done(r.request_id)]),
            ),
            frozenset({"seed"}),
        )
        assert (await run(d, chat_body()))[0] == 200
        assert router.requests[0].requires == []

    async def test_a_migration_asks_for_it_again(self, bundle):
        router = FakeRouter([1, 2])

        def script(req):
            if req.instance_id == 1:
                return [tokens(req.request_id, 5), failed(req.request_id, 1, "cannot_connect")]
            return [tokens(req.request_id, 6), done(req.request_id)]

        d = with_capabilities(deps(bundle, router, FakeDispatcher(script)), frozenset({"seed"}))
        status, _ = await run(d, chat_body(seed=7, temperature=0.5))
        assert status == 200
        assert len(router.requests) == 2
        assert all(r.requires == ["seed"] for r in router.requests)
        assert router.requests[1].exclude == [1]

    async def test_refused_when_no_engine_can(self, bundle):
        router = FakeRouter([1])
        d = deps(bundle, router, FakeDispatcher(lambda r: None))  # SGLang engines only
        status, http = await run(d, chat_body(seed=7))
        assert status == 400
        error = http.json()["error"]
        assert error["param"] == "seed" and error["code"] == "unsupported_value"
        assert router.requests == []


class TestCatalog:
    def instance(self, iid: int, protocol: str, role: str = "aggregated") -> Instance:
        return Instance(
            instance_id=iid, url=f"grpc://h:{iid}", protocol=protocol, model=MODEL,
            context_length=4096, block_size=16, role=role,
        )  # fmt: skip

    def test_a_model_can_what_any_of_its_engines_can(self):
        mixed = build_catalog({1: self.instance(1, "sglang"), 2: self.instance(2, "vllm")})
        assert mixed[MODEL].capabilities == {"seed"}
        sglang = build_catalog({1: self.instance(1, "sglang")})
        assert sglang[MODEL].capabilities == frozenset()

    def test_prefill_engines_do_not_count(self):
        catalog = build_catalog(
            {1: self.instance(1, "sglang"), 2: self.instance(2, "vllm", role="prefill")}
        )
        assert catalog[MODEL].capabilities == frozenset()
