import random

import pytest

from switchyard.router.policies import build_policy
from switchyard.router.types import RouteContext, WorkerView

CTX = RouteContext("r", "m", [1, 2, 3])


def workers(*loads: int) -> list[WorkerView]:
    return [
        WorkerView(
            instance_id=i,
            url=f"grpc://h:{i}",
            model="m",
            role="aggregated",
            in_flight=load,
            in_prefill=0,
        )
        for i, load in enumerate(loads, start=1)
    ]


class TestRoundRobin:
    def test_cycles_in_instance_id_order_whatever_the_input_order(self):
        policy = build_policy("round_robin")
        ws = workers(0, 0, 0)
        picks = [policy.pick(ws[::-1] if n % 2 else ws, CTX).chosen.instance_id for n in range(6)]
        assert picks == [1, 2, 3, 1, 2, 3]


class TestRandom:
    def test_covers_every_worker_and_follows_the_rng(self):
        a = build_policy("random", random.Random(7))
        b = build_policy("random", random.Random(7))
        ws = workers(0, 0, 0)
        picks_a = [a.pick(ws, CTX).chosen.instance_id for _ in range(60)]
        picks_b = [b.pick(ws, CTX).chosen.instance_id for _ in range(60)]
        assert picks_a == picks_b
        assert set(picks_a) == {1, 2, 3}


class TestLeastLoaded:
    def test_picks_the_lowest_load(self):
        policy = build_policy("least_loaded", random.Random(1))
        assert policy.pick(workers(3, 1, 2), CTX).chosen.instance_id == 2

    def test_ties_are_shared(self):
        policy = build_policy("least_loaded", random.Random(1))
        picks = {policy.pick(workers(1, 0, 0), CTX).chosen.instance_id for _ in range(50)}
        assert picks == {2, 3}


def test_unknown_mode_fails_loudly():
    with pytest.raises(ValueError, match="unknown router mode"):
        build_policy("kv-magic")
