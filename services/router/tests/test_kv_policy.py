import random

import pytest

from switchyard.common.block_hash import block_hashes
from switchyard.protos.messages import Instance, RouteRequest
from switchyard.router.core import RouterCore
from switchyard.router.kv.types import Stored
from switchyard.router.policies import build_policy
from switchyard.router.policies.kv import KvAware, KvParams
from switchyard.router.types import RouteContext, WorkerView

BLOCK = 4


def view(iid, overlap=0, pending=0, active=0, in_flight=0):
    return WorkerView(
        instance_id=iid,
        url=f"grpc://h:{iid}",
        model="m",
        role="aggregated",
        in_flight=in_flight,
        in_prefill=0,
        overlap_blocks=overlap,
        pending_prefill_blocks=pending,
        active_blocks=active,
    )


CTX = RouteContext("r", "m", list(range(40)), prompt_blocks=10)


class TestCost:
    def test_overlap_wins_when_idle(self):
        policy = KvAware(random.Random(0))
        assert policy.pick([view(1, overlap=2), view(2, overlap=8)], CTX).chosen.instance_id == 2

    def test_cost_formula(self):
        policy = KvAware(random.Random(0), KvParams(overlap_weight=2.0))
        costs = policy.pick([view(1, overlap=4, pending=3, active=5)], CTX).costs
        assert costs == {1: 2.0 * (10 - 4 + 3) + 5}

    def test_load_outweighs_a_small_overlap(self):
        policy = KvAware(random.Random(0))
        busy = view(1, overlap=2, pending=20, active=40)
        assert policy.pick([busy, view(2)], CTX).chosen.instance_id == 2

    def test_ties_go_to_fewer_requests_then_random(self):
        policy = KvAware(random.Random(0))
        assert (
            policy.pick([view(1, in_flight=3), view(2, in_flight=1)], CTX).chosen.instance_id == 2
        )
        picks = {policy.pick([view(1), view(2)], CTX).chosen.instance_id for _ in range(40)}
        assert picks == {1, 2}

    def test_temperature_samples_but_prefers_cheap(self):
        policy = KvAware(random.Random(0), KvParams(temperature=1.0))
        picks = [
            policy.pick([view(1, overlap=10), view(2)], CTX).chosen.instance_id for _ in range(200)
        ]
        assert picks.count(1) > picks.count(2) > 0

    @pytest.mark.parametrize(
        "kwargs", [{"overlap_weight": -1}, {"temperature": -0.5}, {"temperature": float("nan")}]
    )
    def test_bad_params_fail_loudly(self, kwargs):
        with pytest.raises(ValueError):
            KvParams(**kwargs)


def inst(iid: int) -> Instance:
    return Instance(
        instance_id=iid,
        url=f"grpc://h:{iid}",
        protocol="vllm",
        model="m",
        context_length=4096,
        block_size=BLOCK,
    )


def stored(tokens: list[int], engine_hashes: list[int]) -> Stored:
    return Stored(block_hashes=engine_hashes, parent=None, token_ids=tokens, block_size=BLOCK)


class TestCoreWithIndex:
    def make(self):
        core = RouterCore(build_policy("kv", random.Random(0)))
        core.set_instances({1: inst(1), 2: inst(2), 3: inst(3)})
        return core

    def test_routes_to_the_worker_holding_the_prefix(self):
        core = self.make()
        prefix = list(range(100, 116))  # 4 blocks
        core.index.apply_batch(2, [stored(prefix, [11, 12, 13, 14])])
        reply = core.route(
            RouteRequest(request_id="a", model="m", token_ids=prefix + [1, 2, 3]), now=0
        ).response
        assert (reply.instance_id, reply.overlap_blocks, reply.prompt_blocks) == (2, 4, 4)

    def test_dry_run_explains_and_books_nothing(self):
        core = self.make()
        prefix = list(range(100, 116))
        core.index.apply_batch(3, [stored(prefix[:8], [1, 2])])
        reply = core.route(
            RouteRequest(request_id="a", model="m", token_ids=prefix, dry_run=True), now=0
        ).response
        assert reply.instance_id == 3
        assert {w.instance_id: w.overlap_blocks for w in reply.workers} == {1: 0, 2: 0, 3: 2}
        assert {w.instance_id: w.cost for w in reply.workers} == {1: 4.0, 2: 4.0, 3: 2.0}
        assert len(core.tracker) == 0

    def test_in_flight_prefill_spreads_identical_cold_requests(self):
        core = self.make()
        tokens = list(range(200, 232))
        picks = {
            core.route(
                RouteRequest(request_id=f"r{n}", model="m", token_ids=tokens), now=0
            ).response.instance_id
            for n in range(3)
        }
        assert picks == {1, 2, 3}

    def test_block_hashes_match_the_index_keys(self):
        core = self.make()
        tokens = list(range(300, 312))
        core.index.apply_batch(1, [stored(tokens, [7, 8, 9])])
        assert core.index.overlaps(block_hashes(tokens, BLOCK)) == {1: 3}
