"""The round-robin picker: turns in (instance id, rank) order; a dry run takes no turn."""

import random

from switchyard.router.policies.round_robin import RoundRobin
from switchyard.router.tests.helpers import inst, req
from switchyard.router.timing import TimeModel
from switchyard.router.types import EngineLoad, RouteContext, RouterLoad, Worker


def workers(*ids):
    return [Worker(inst(i, model="m"), 0, RouterLoad(), EngineLoad()) for i in ids]


def ctx(dry_run=False):
    return RouteContext(req("r", [1, 2, 3], dry_run=dry_run), 0.0, TimeModel(), explain=dry_run)


def test_turns_follow_instance_ids_whatever_the_candidate_order():
    picker = RoundRobin()
    ws = workers(30, 10, 20)
    totals = [0.0, 0.0, 0.0]
    picked = [ws[picker.pick(ctx(), ws, totals)].instance_id for _ in range(4)]
    assert picked == [10, 20, 30, 10]


def test_a_dry_run_shows_the_next_turn_without_taking_it():
    picker = RoundRobin()
    ws = workers(*random.Random(3).sample([1, 2, 3], 3))
    totals = [0.0] * 3
    assert ws[picker.pick(ctx(dry_run=True), ws, totals)].instance_id == 1
    assert ws[picker.pick(ctx(dry_run=True), ws, totals)].instance_id == 1
    assert ws[picker.pick(ctx(), ws, totals)].instance_id == 1
    assert ws[picker.pick(ctx(), ws, totals)].instance_id == 2
