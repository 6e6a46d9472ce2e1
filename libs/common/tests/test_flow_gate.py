"""The flow gate's rules, on a clock passed in: order, fairness in tokens, outranking, shedding
by objective, the queue's bounds, and what a preprocessor's sync repairs."""

from __future__ import annotations

import heapq
import random

import pytest

from switchyard.common.flow.config import from_mapping
from switchyard.common.flow.gate import (
    FLOW_LIMIT,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    SYNC_GRACE_S,
    TTFT_OBJECTIVE,
    FlowGate,
    Limits,
    Ticket,
)


def gate(**raw) -> FlowGate:
    return FlowGate(from_mapping({"max_running": 2, "burst": 0, "max_queued": 1000, **raw}))


def offer(g: FlowGate, id: str, flow: str = "a", now: float = 0.0, **kw) -> list:
    return g.offer(Ticket(id, flow, **kw), now)


def admitted(decisions) -> list[str]:
    return [d.ticket.id for d in decisions if d.admitted]


class TestOrder:
    def test_runs_at_once_under_the_limit_then_queues(self):
        g = gate()
        assert admitted(offer(g, "1")) == ["1"]
        assert admitted(offer(g, "2")) == ["2"]
        assert offer(g, "3") == []  # queued
        assert g.running == 2 and g.queued == 1
        assert admitted(g.release("1", 1.0)) == ["3"]

    def test_more_urgent_band_first(self):
        g = gate()
        offer(g, "r1"), offer(g, "r2")
        offer(g, "batch", priority=10, now=0.1)
        offer(g, "urgent", priority=-1, now=0.2)
        offer(g, "normal", priority=0, now=0.3)
        order = admitted(g.release("r1", 1.0)) + admitted(g.release("r2", 1.1))
        order += admitted(g.release("urgent", 2.0))
        assert order == ["urgent", "normal", "batch"]

    def test_deadline_order_within_a_flow(self):
        g = gate()
        offer(g, "r1"), offer(g, "r2")
        offer(g, "late", now=0.1)  # no objective: after every deadline
        offer(g, "loose", now=0.2, objective_s=60.0)
        offer(g, "tight", now=0.3, objective_s=30.0)
        order = admitted(g.release("r1", 1.0)) + admitted(g.release("r2", 1.0))
        order += admitted(g.release(order[0], 1.5))
        assert order == ["tight", "loose", "late"]

    def test_a_cancelled_waiter_frees_its_place(self):
        g = gate()
        offer(g, "r1"), offer(g, "r2"), offer(g, "w1"), offer(g, "w2")
        assert g.release("w1", 0.5) == []
        assert g.queued == 1
        assert admitted(g.release("r1", 1.0)) == ["w2"]

    def test_a_request_larger_than_the_deployment_runs_alone(self):
        g = gate()
        assert admitted(offer(g, "big", units=5)) == ["big"]
        assert offer(g, "small") == []
        assert admitted(g.release("big", 1.0)) == ["small"]


def served_tokens(g: FlowGate, flows: dict[str, int], rounds: int) -> dict[str, int]:
    """Every flow keeps a backlog of requests of its own cost; the gate serves `rounds`
    releases one at a time: tokens each flow got."""
    got = dict.fromkeys(flows, 0)
    n = 0
    running: list[Ticket] = []
    now = 0.0
    for flow, cost in flows.items():
        for _ in range(20):
            n += 1
            running += [d.ticket for d in offer(g, f"{flow}{n}", flow, now, cost=cost)]
    for _ in range(rounds):
        now += 0.01
        done = running.pop(0)
        got[done.flow] += done.cost
        running += [d.ticket for d in g.release(done.id, now, done.cost)]
        n += 1
        offer(g, f"{done.flow}{n}", done.flow, now, cost=done.cost)  # keep it backlogged
    assert all(t.state == "running" for t in running)
    return got


class TestFairness:
    def test_equal_weights_share_tokens_not_requests(self):
        g = gate(max_running=1)
        got = served_tokens(g, {"small": 100, "large": 400}, 400)
        assert got["large"] / got["small"] == pytest.approx(1.0, rel=0.05)

    def test_weights_set_the_shares(self):
        g = gate(max_running=1, flows={"gold": {"weight": 3}, "base": {"weight": 1}})
        got = served_tokens(g, {"gold": 100, "base": 100}, 400)
        assert got["gold"] / got["base"] == pytest.approx(3.0, rel=0.05)

    def test_an_unnamed_flow_takes_the_default_entry(self):
        g = gate(flows={"default": {"weight": 2}, "named": {"weight": 1}})
        assert g.config.spec("tenant-x").weight == 2
        assert g.config.spec("named").weight == 1


class TestOutranking:
    def test_an_urgent_request_runs_beyond_max_running_up_to_the_burst(self):
        g = gate(max_running=2, burst=1)
        offer(g, "b1", priority=5), offer(g, "b2", priority=5)
        offer(g, "b3", priority=5)  # queued: same rank as what runs
        assert admitted(offer(g, "u1", priority=0)) == ["u1"]
        assert offer(g, "u2", priority=0) == []  # the burst is used up
        assert g.running_units == 3
        # A batch request ending makes room for the queued urgent one (it outranks b2)...
        assert admitted(g.release("b1", 1.0)) == ["u2"]
        # ...and no batch request runs until the deployment is back under max_running.
        assert admitted(g.release("b2", 1.1)) == []
        assert admitted(g.release("u1", 1.2)) == ["b3"]

    def test_a_flow_under_its_share_displaces_one_over_it(self):
        g = gate(max_running=4, burst=2)
        now = 0.0
        for i in range(4):
            offer(g, f"flood{i}", "flood", now)
        for i in range(4, 10):
            offer(g, f"flood{i}", "flood", now)  # queued
        assert admitted(offer(g, "steady1", "steady", 0.1)) == ["steady1"]
        assert g.running_units == 5

    def test_a_flow_that_ran_alone_is_not_over_its_share_when_a_flood_arrives(self):
        """Regression: the share had memory of when a flow ran alone, so a steady flow that
        had the band to itself queued behind a flood that arrived after it (issue 37)."""
        g = gate(max_running=4, burst=2)
        for i in range(40):  # alone: one request at a time for 40 s
            offer(g, f"s{i}", "steady", float(i))
            g.release(f"s{i}", i + 0.5)
        offer(g, "s40", "steady", 40.0)
        for i in range(10):
            offer(g, f"flood{i}", "flood", 40.1)  # 3 run, 7 queue
        assert g.running_units == 4 and g.queued == 7
        assert admitted(offer(g, "s41", "steady", 40.2)) == ["s41"]  # displaces the flood

    def test_no_displacing_within_the_same_share(self):
        """Two flows that each took half the recent tokens: neither outranks the other."""
        g = gate(max_running=2, burst=2)
        offer(g, "a1", "a"), offer(g, "b1", "b")
        offer(g, "a2", "a", 0.1), offer(g, "b2", "b", 0.1)
        assert g.running_units == 2 and g.queued == 2

    def test_a_flow_with_a_queue_waits_in_it(self):
        g = gate(max_running=2, burst=2)
        for i in range(2):
            offer(g, f"f{i}", "flood")
        offer(g, "s1", "steady", 0.1)  # runs: outranks the flood
        g.bands[0].flows["steady"].recent = 0.0  # still under its share...
        offer(g, "f9", "flood", 0.2)
        flood = g.bands[0].flows["flood"]
        assert flood.queued == 1
        assert offer(g, "f10", "flood", 0.3) == []  # ...but the flood only queues


class TestObjective:
    def test_refused_at_once_when_the_engine_alone_is_too_slow(self):
        g = gate()
        [d] = offer(g, "x", objective_s=0.1, engine_ttft_s=0.2)
        assert not d.admitted and d.reason == TTFT_OBJECTIVE
        assert "200 ms on the best engine" in d.message and d.retry_after_s > 0
        assert g.running == 0 and g.shed[("default", "other", TTFT_OBJECTIVE)] == 1

    def test_refused_at_once_when_the_queue_ahead_is_too_long(self):
        g = gate(max_running=1)
        offer(g, "r", now=0.0)
        g.release("r", 0.3)  # runs take 0.3 s
        offer(g, "r2", now=1.0)
        for i in range(3):  # each within its 1 s objective, and due before x
            assert offer(g, f"w{i}", now=1.0, objective_s=1.0) == []
        [d] = offer(g, "x", now=1.0, objective_s=1.1, engine_ttft_s=0.1)
        assert d.reason == TTFT_OBJECTIVE
        assert d.predicted_s == pytest.approx(4 * 0.3 + 0.1)

    def test_a_queued_request_is_refused_once_its_latest_start_passes(self):
        g = gate(max_running=1)
        offer(g, "r")
        assert offer(g, "x", now=0.0, objective_s=1.0, engine_ttft_s=0.3) == []
        assert g.next_due() == pytest.approx(0.7)
        assert g.expire(0.69) == []
        [d] = g.expire(0.71)
        assert d.reason == TTFT_OBJECTIVE and not d.admitted and d.wait_s == pytest.approx(0.71)
        assert g.queued == 0


class TestBounds:
    def test_queue_full(self):
        g = gate(max_running=1, max_queued=1)
        offer(g, "r"), offer(g, "w")
        [d] = offer(g, "x")
        assert d.reason == QUEUE_FULL and d.retry_after_s > 0

    def test_a_full_queue_refuses_the_largest_flows_last_request_for_a_smaller_flow(self):
        g = gate(max_running=1, max_queued=2)
        offer(g, "r", "flood")
        offer(g, "f1", "flood", 0.1), offer(g, "f2", "flood", 0.2)
        out = offer(g, "s1", "steady", 0.3)
        assert [(d.ticket.id, d.reason) for d in out] == [("f2", QUEUE_FULL)]
        assert g.queued == 2 and g.tickets["s1"].state == "queued"

    def test_a_full_queue_refuses_a_less_urgent_request_for_a_more_urgent_one(self):
        g = gate(max_running=1, max_queued=1)
        offer(g, "r", "a")
        offer(g, "batch", "a", priority=9)
        out = offer(g, "urgent", "a", priority=-9)
        assert [(d.ticket.id, d.reason) for d in out] == [("batch", QUEUE_FULL)]

    def test_queue_timeout(self):
        g = gate(max_running=1, queue_timeout_s=2)
        offer(g, "r"), offer(g, "w")
        [d] = g.expire(2.01)
        assert d.reason == QUEUE_TIMEOUT and d.ticket.id == "w"

    def test_a_requests_own_deadline_bounds_its_wait(self):
        g = gate(max_running=1, queue_timeout_s=30)
        offer(g, "r"), offer(g, "w", max_wait_s=0.5)
        assert g.next_due() == pytest.approx(0.5)

    def test_flow_cap(self):
        g = gate(max_running=8, flows={"default": {"max_requests": 2}})
        offer(g, "1", "t"), offer(g, "2", "t")
        [d] = offer(g, "3", "t")
        assert d.reason == FLOW_LIMIT
        assert admitted(offer(g, "4", "other-tenant")) == ["4"]

    def test_a_share_of_the_limits(self):
        config = from_mapping({"max_running": 10, "burst": 4, "max_queued": 30})
        assert Limits.of(config, 3) == Limits(3, 1, 10, 30.0)
        assert Limits.of(config, 50).max_running == 1


class TestSync:
    def test_a_lost_release_is_repaired(self):
        g = gate(max_running=1)
        offer(g, "r", peer="p"), offer(g, "w", peer="p")
        assert g.sync("p", [Ticket("r", "a")], 1.0) == []  # still running
        out = g.sync("p", [], SYNC_GRACE_S + 1.0)  # "r" ended, its release lost
        assert admitted(out) == ["w"]

    def test_running_tickets_of_another_gate_are_adopted(self):
        g = gate(max_running=2)
        g.sync("p", [Ticket("x", "a"), Ticket("y", "b")], 0.0)
        assert g.running_units == 2
        assert offer(g, "z", peer="q") == []

    def test_a_silent_peer_is_forgotten(self):
        g = gate(max_running=1)
        offer(g, "r", peer="gone"), offer(g, "w", peer="alive")
        g.sync("alive", [], 4.0)
        out = g.expire(6.0)
        assert admitted(out) == ["w"]
        assert g.peers(6.0) == 1


def poisson(rng: random.Random, rate: float, seconds: float, **kw) -> list[tuple[float, dict]]:
    out: list[tuple[float, dict]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append((t, kw))


def simulate(g: FlowGate, arrivals: list[tuple[float, dict]], run_s: float) -> dict:
    """Requests that each run `run_s` once admitted: per flow, the waits of the admitted
    ones and the refusals (with how long each waited first)."""
    arrivals = sorted(arrivals, key=lambda a: a[0])
    ends: list[tuple[float, str]] = []
    out: dict[str, dict] = {}

    def book(decisions, at: float) -> None:
        for d in decisions:
            stats = out.setdefault(d.ticket.flow, {"waits": [], "refused": []})
            if d.admitted:
                stats["waits"].append(at - d.ticket.arrived)
                heapq.heappush(ends, (at + run_s, d.ticket.id))
            else:
                stats["refused"].append((d.reason, at - d.ticket.arrived))

    for n, (at, kw) in enumerate(arrivals):
        while ends and ends[0][0] <= at:
            end, tid = heapq.heappop(ends)
            book(g.expire(end), end)
            book(g.release(tid, end), end)
        book(g.expire(at), at)
        book(g.offer(Ticket(f"r{n}", **kw), at), at)
    return out


class TestSimulation:
    """Closed arithmetic of a busy deployment (each request runs `run_s`; capacity is
    max_running / run_s requests per second)."""

    run_s = 0.8
    capacity = 16 / run_s

    def gate(self, **raw) -> FlowGate:
        return gate(max_running=16, burst=8, max_queued=64, **raw)

    def test_a_steady_flow_beside_a_flood_starts_at_once(self):
        rng = random.Random(7)
        load = poisson(rng, 0.3 * self.capacity, 60, flow="steady", cost=100)
        load += poisson(rng, 5 * self.capacity, 60, flow="flood", cost=100)
        out = simulate(self.gate(), load, self.run_s)
        steady, flood = out["steady"], out["flood"]
        assert steady["refused"] == []
        at_once = sum(1 for w in steady["waits"] if w == 0.0) / len(steady["waits"])
        assert at_once > 0.99, sorted(steady["waits"])[-10:]
        # The flood gets the rest of the capacity.
        assert len(flood["waits"]) / 60 == pytest.approx(0.7 * self.capacity, rel=0.1)

    def test_a_steady_flow_that_ran_alone_starts_at_once_when_a_flood_arrives(self):
        """Regression: usage from a flow's time alone counted against its share, so for the
        flood's first seconds the steady flow queued with it (issue 37)."""
        rng = random.Random(11)
        load = poisson(rng, 0.3 * self.capacity, 60, flow="steady", cost=100)
        flood = poisson(rng, 5 * self.capacity, 40, flow="flood", cost=100)
        load += [(at + 20.0, kw) for at, kw in flood]  # the steady flow alone for 20 s
        out = simulate(self.gate(), load, self.run_s)
        steady = out["steady"]
        assert steady["refused"] == []
        at_once = sum(1 for w in steady["waits"] if w == 0.0) / len(steady["waits"])
        assert at_once > 0.99, sorted(steady["waits"])[-10:]

    def test_interactive_beside_a_saturating_batch_flow_starts_at_once(self):
        rng = random.Random(8)
        load = poisson(rng, 0.3 * self.capacity, 60, flow="ui", priority=0, cost=100)
        load += poisson(rng, 3 * self.capacity, 60, flow="batch", priority=10, cost=100)
        out = simulate(self.gate(), load, self.run_s)
        ui, batch = out["ui"], out["batch"]
        assert ui["refused"] == []
        at_once = sum(1 for w in ui["waits"] if w == 0.0) / len(ui["waits"])
        assert at_once > 0.99, sorted(ui["waits"])[-10:]
        assert len(batch["waits"]) / 60 == pytest.approx(0.7 * self.capacity, rel=0.1)

    def test_objectives_refuse_early_instead_of_serving_late(self):
        rng = random.Random(9)
        objective, engine = 1.0, 0.1
        load = poisson(
            rng, 3 * self.capacity, 60, flow="a", cost=100, objective_s=objective,
            engine_ttft_s=engine,
        )  # fmt: skip
        out = simulate(self.gate(), load, self.run_s)["a"]
        late = [w for w in out["waits"] if w + engine > objective]
        assert len(late) / len(out["waits"]) < 0.05
        assert len(out["waits"]) / 60 == pytest.approx(self.capacity, rel=0.1)
        at_once = [w for reason, w in out["refused"] if w == 0.0]
        assert len(at_once) / len(out["refused"]) > 0.9  # mostly refused on arrival
