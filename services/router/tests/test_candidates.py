"""The router's candidate filters and libs/common's candidates (the preprocessor's fallback
applies those) keep to the same rules: for a fleet of every kind of engine, the filters a
whole request without a hop passes (same_model, capable, not_excluded, serves_requests,
local_prefill) keep exactly `whole_request_engines`."""

import random

import pytest

from switchyard.common.candidates import RoundRobin, whole_request_engines
from switchyard.protos.messages import ROLE_DECODE, ROLE_PREFILL, Instance, RouteRequest
from switchyard.router.config import PluginConfig
from switchyard.router.policies import build_plugin
from switchyard.router.timing import TimeModel
from switchyard.router.types import EngineLoad, PluginDeps, RouteContext, RouterLoad, Worker

FILTERS = ("same_model", "capable", "not_excluded", "serves_requests", "local_prefill")


def inst(iid: int, model: str, protocol: str, role: str, local_prefill: bool) -> Instance:
    return Instance(
        instance_id=iid,
        url=f"grpc://h:{iid}",
        protocol=protocol,
        model=model,
        context_length=1024,
        block_size=16,
        role=role,
        local_prefill=local_prefill,
    )


FLEET = [
    inst(i, *kind)
    for i, kind in enumerate(
        (model, protocol, role, local)
        for model in ("m", "other")
        for protocol in ("sglang", "vllm")
        for role in ("aggregated", ROLE_PREFILL, ROLE_DECODE)
        for local in (True, False)
    )
]


@pytest.mark.parametrize("requires", [[], ["seed"]])
@pytest.mark.parametrize("exclude", [[], [0], [0, 6, 7]])
def test_the_routers_filters_keep_the_whole_request_engines(exclude, requires):
    deps = PluginDeps(random.Random(0), TimeModel())
    filters = [build_plugin("filter", PluginConfig(name), deps) for name in FILTERS]
    request = RouteRequest(
        request_id="r", model="m", token_ids=[1], exclude=exclude, requires=requires
    )
    ctx = RouteContext(request, 0.0, deps.time)
    workers = [Worker(i, 0, RouterLoad(), EngineLoad()) for i in FLEET]
    for plugin in filters:
        workers = plugin.filter(ctx, workers)
    expected = whole_request_engines(FLEET, "m", exclude, requires)
    assert [w.instance for w in workers] == expected and expected
    if requires:  # only vLLM engines carry a seed
        assert {i.protocol for i in expected} == {"vllm"}


def test_round_robin_in_instance_id_order_and_dry_runs_take_no_turn():
    turn = RoundRobin()
    fleet = [FLEET[4], FLEET[0], FLEET[2]]
    assert turn.pick(fleet, dry_run=True) is FLEET[0]
    assert [turn.pick(fleet).instance_id for _ in range(4)] == [0, 2, 4, 0]
