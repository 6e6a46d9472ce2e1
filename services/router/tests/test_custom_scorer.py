"""Adding a scorer is one class and one registration line (docs/routing.md's example)."""

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from switchyard.router import config
from switchyard.router.policies import SCORERS
from switchyard.router.tests.helpers import core, inst, req
from switchyard.router.types import Needs, PluginDeps, RouteContext, Worker


@dataclass(frozen=True, slots=True)
class PreferParams:
    protocol: str = "vllm"


class PreferProtocol:
    """Score 1 for engines of one protocol, 0 for the others."""

    name = "prefer_protocol"
    needs = Needs.NONE
    Params = PreferParams

    def __init__(self, params: PreferParams, deps: PluginDeps) -> None:
        self.protocol = params.protocol

    def score(self, ctx: RouteContext, workers: Sequence[Worker]) -> list[float]:
        return [1.0 if w.instance.protocol == self.protocol else 0.0 for w in workers]


@pytest.fixture
def registered():
    SCORERS["prefer_protocol"] = PreferProtocol  # the one registration line
    yield
    del SCORERS["prefer_protocol"]


def test_a_new_scorer_takes_part_in_routing(registered):
    routing = config.from_mapping(
        {
            "decode": {
                "scorers": [
                    "inflight_load",
                    {"name": "prefer_protocol", "weight": 5, "protocol": "sglang"},
                ]
            }
        }
    )
    c = core(inst(1, protocol="vllm"), inst(2, protocol="sglang"), config=routing)
    picks = {c.route(req(f"r{n}", [n] * 32), now=0).response.instance_id for n in range(4)}
    assert picks == {2}
    reply = c.route(req("d", [1] * 32, dry_run=True), now=0).response
    assert {w.instance_id: w.scores["prefer_protocol"] for w in reply.workers} == {1: 0.0, 2: 1.0}
