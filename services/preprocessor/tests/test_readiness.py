"""/ready's reasons: engines, tokenizer, dispatcher, router or a fallback that can place."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from switchyard.preprocessor.catalog import build_catalog
from switchyard.protos.messages import Instance

MODEL = "m"


def instance(role: str = "aggregated", local_prefill: bool = True) -> Instance:
    return Instance(
        instance_id=1,
        url="grpc://10.0.0.1:1",
        protocol="sglang",
        model=MODEL,
        context_length=4096,
        block_size=16,
        role=role,
        local_prefill=local_prefill,
    )


@pytest.fixture
async def state(monkeypatch, offline_state):
    s = offline_state
    up = {"tokenizer": True, "dispatcher": True, "router": True}
    monkeypatch.setattr(s.tokenizers, "loaded", lambda: {MODEL} if up["tokenizer"] else set())
    monkeypatch.setattr(s.dispatcher, "connected", lambda: up["dispatcher"])
    monkeypatch.setattr(s.router, "connected", lambda: up["router"])
    s.up = up

    def serve(*instances: Instance) -> None:
        known = MappingProxyType({i.instance_id: i for i in instances})
        monkeypatch.setattr(type(s.fleet), "instances", property(lambda self: known))
        s.catalog = build_catalog(known)

    s.serve = serve
    yield s
    await s.dispatcher.close()
    await s.router.close()
    await s.fleet.close()


def test_ready_when_everything_is_there(state):
    state.serve(instance())
    assert state.not_ready_reason() == ""


def test_no_engine(state):
    state.serve()
    assert state.not_ready_reason() == "no engine is routable"


def test_no_tokenizer(state):
    state.serve(instance())
    state.up["tokenizer"] = False
    assert "tokenizer" in state.not_ready_reason()


def test_no_dispatcher(state):
    state.serve(instance())
    state.up["dispatcher"] = False
    assert state.not_ready_reason() == "no dispatcher is reachable"


def test_no_router_is_fine_while_the_fallback_can_place_requests(state):
    state.serve(instance())
    state.up["router"] = False
    assert state.not_ready_reason() == ""


def test_no_router_and_only_engines_the_fallback_cannot_use(state):
    state.serve(instance(role="decode", local_prefill=False))
    state.up["router"] = False
    assert "no router is reachable" in state.not_ready_reason()
