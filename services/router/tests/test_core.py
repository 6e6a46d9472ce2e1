import random

from switchyard.protos.messages import (
    ROLE_DECODE,
    ROLE_PREFILL,
    STAGE_FINISHED,
    STAGE_FIRST_TOKEN,
    Instance,
    RouteProgress,
    RouteRequest,
)
from switchyard.router.config import preset
from switchyard.router.core import ALL_BUSY, NO_WORKER, UNKNOWN_MODEL, RouterCore


def inst(iid: int, model: str = "m", role: str = "aggregated") -> Instance:
    return Instance(
        instance_id=iid,
        url=f"grpc://h:{iid}",
        protocol="sglang",
        model=model,
        context_length=1024,
        block_size=16,
        role=role,
    )


def req(rid: str, model: str = "m", exclude: list[int] | None = None) -> RouteRequest:
    return RouteRequest(request_id=rid, model=model, token_ids=[1, 2], exclude=exclude or [])


def core(*instances: Instance, mode: str = "least_loaded") -> RouterCore:
    c = RouterCore(preset(mode), rng=random.Random(0))
    c.set_instances({i.instance_id: i for i in instances})
    return c


class TestCandidates:
    def test_only_the_requested_model(self):
        c = core(inst(1, "a"), inst(2, "b"))
        assert c.route(req("r", "b"), now=0).response.instance_id == 2

    def test_prefill_engines_never_take_whole_requests(self):
        c = core(inst(1, role=ROLE_PREFILL), inst(2, role=ROLE_DECODE))
        assert {c.route(req(f"r{n}"), now=0).response.instance_id for n in range(5)} == {2}

    def test_excluded_instances_are_skipped(self):
        c = core(inst(1), inst(2))
        assert c.route(req("r", exclude=[1]), now=0).response.instance_id == 2

    def test_unknown_model_and_no_worker_are_told_apart(self):
        c = core(inst(1))
        assert c.route(req("r", "nope"), now=0).response.error == UNKNOWN_MODEL
        reply = c.route(req("r", exclude=[1]), now=0).response
        assert (reply.instance_id, reply.error) == (None, NO_WORKER)


class TestLoadBookkeeping:
    def test_least_loaded_spreads_and_progress_frees(self):
        c = core(inst(1), inst(2))
        first = c.route(req("a"), now=0).response.instance_id
        second = c.route(req("b"), now=0).response.instance_id
        assert {first, second} == {1, 2}
        c.progress(RouteProgress("a", first, STAGE_FIRST_TOKEN))
        c.progress(RouteProgress("a", first, STAGE_FINISHED))
        assert c.route(req("c"), now=0).response.instance_id == first

    def test_a_whole_request_teaches_the_time_model_nothing(self):
        """Its first token comes with its last: that time is no prefill's. Its prefill
        booking ends at the time the model predicted (a few ms for two tokens)."""
        c = core(inst(1), mode="kv")
        whole = RouteRequest(request_id="w", model="m", token_ids=[1, 2], whole=True)
        c.route(whole, now=0)
        load = c.tracker.load((1, 0))
        assert load.in_prefill == 1
        c.route(req("x"), now=1.0)  # any later route releases the predicted prefills
        assert load.in_prefill == 1  # x's own
        c.progress(RouteProgress("w", 1, STAGE_FIRST_TOKEN), now=30.0)
        assert c.time.own_speed((1, 0)).n == 0
        c.progress(RouteProgress("x", 1, STAGE_FIRST_TOKEN), now=1.5)
        assert c.time.own_speed((1, 0)).n == 1  # a streamed request does teach it

    def test_removed_instance_forgets_its_load(self):
        c = core(inst(1), inst(2))
        c.route(req("a"), now=0)
        c.set_instances({2: inst(2)})
        assert c.tracker.load((1, 0)).in_flight == 0


class TestBusy:
    def test_busy_instance_is_avoided_until_it_expires(self):
        c = core(inst(1), inst(2))
        c.mark_busy(1, until=5)
        assert {c.route(req(f"r{n}"), now=1).response.instance_id for n in range(4)} == {2}
        assert 1 in {c.route(req(f"s{n}"), now=6).response.instance_id for n in range(4)}

    def test_all_busy_is_its_own_error(self):
        c = core(inst(1), inst(2))
        c.mark_busy(1, until=5)
        c.mark_busy(2, until=5)
        reply = c.route(req("r"), now=1).response
        assert (reply.instance_id, reply.error) == (None, ALL_BUSY)
