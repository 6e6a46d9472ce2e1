"""The router's prefill hop: prefill choice, the skip threshold, load booking, dry runs."""

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
from switchyard.router.core import NO_WORKER, PREFILL_BOOKING, RouterCore


def inst(iid: int, role: str, local_prefill: bool = True, model: str = "m") -> Instance:
    return Instance(
        instance_id=iid,
        url=f"grpc://h:{iid}",
        protocol="sglang",
        model=model,
        context_length=4096,
        block_size=16,
        role=role,
        bootstrap_port=9000 + iid if role == ROLE_PREFILL else None,
        local_prefill=local_prefill,
    )


def req(rid: str, tokens: int = 32, exclude=(), dry_run=False, start=0) -> RouteRequest:
    return RouteRequest(
        request_id=rid,
        model="m",
        token_ids=list(range(start, start + tokens)),
        exclude=list(exclude),
        dry_run=dry_run,
    )


def core(*instances: Instance, mode: str = "kv", threshold: int = 256) -> RouterCore:
    c = RouterCore(preset(mode), rng=random.Random(0), disagg_min_uncached_tokens=threshold)
    c.set_instances({i.instance_id: i for i in instances})
    return c


def test_decode_only_workers_always_get_a_prefill_worker():
    c = core(inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE, local_prefill=False))
    reply = c.route(req("r"), now=0).response
    assert (reply.instance_id, reply.prefill_instance_id) == (2, 1)


def test_short_uncached_prompt_skips_the_hop_on_a_worker_that_can_prefill():
    c = core(inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE), threshold=256)
    assert c.route(req("short", tokens=100), now=0).response.prefill_instance_id is None
    assert c.route(req("long", tokens=300, start=5000), now=0).response.prefill_instance_id == 1


def test_threshold_counts_only_the_uncached_part():
    c = core(inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE), threshold=100)
    first = c.route(req("a", tokens=320), now=0).response
    assert first.prefill_instance_id == 1
    # The decode worker is now predicted to hold the prompt: little left to prefill there.
    again = c.route(req("b", tokens=330), now=1).response
    assert again.instance_id == 2 and again.prefill_instance_id is None


def test_prefill_worker_by_load_and_excluded_ones_skipped():
    c = core(
        inst(1, ROLE_PREFILL),
        inst(3, ROLE_PREFILL),
        inst(2, ROLE_DECODE, local_prefill=False),
        mode="least_loaded",
    )
    first = c.route(req("a"), now=0).response.prefill_instance_id
    second = c.route(req("b"), now=0).response.prefill_instance_id
    assert {first, second} == {1, 3}
    assert c.route(req("c", exclude=[1]), now=0).response.prefill_instance_id == 3


def test_prefill_booking_freed_at_first_token():
    c = core(inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE, local_prefill=False))
    c.route(req("r"), now=0)
    assert c.tracker.load((1, 0)).in_flight == 1 and c.tracker.load((2, 0)).in_flight == 1
    c.progress(RouteProgress("r", 2, STAGE_FIRST_TOKEN))
    assert c.tracker.load((1, 0)).in_flight == 0 and c.tracker.load((2, 0)).in_flight == 1
    c.progress(RouteProgress("r", 2, STAGE_FINISHED))
    assert c.tracker.load((2, 0)).in_flight == 0 and len(c.tracker) == 0
    assert PREFILL_BOOKING.startswith("#")


def test_no_prefill_left_means_only_workers_that_can_prefill():
    c = core(
        inst(1, ROLE_PREFILL),
        inst(2, ROLE_DECODE, local_prefill=False),
        inst(4, ROLE_DECODE, local_prefill=True),
    )
    for n in range(4):
        reply = c.route(req(f"r{n}", exclude=[1]), now=0).response
        assert (reply.instance_id, reply.prefill_instance_id) == (4, None)
    reply = core(inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE, local_prefill=False)).route(
        req("x", exclude=[1]), now=0
    )
    assert (reply.response.instance_id, reply.response.error) == (None, NO_WORKER)


def test_dry_run_lists_prefill_candidates_and_books_nothing():
    c = core(inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE, local_prefill=False))
    reply = c.route(req("d", dry_run=True), now=0).response
    assert reply.prefill_instance_id == 1
    assert sorted((w.instance_id, w.role) for w in reply.workers) == [
        (1, ROLE_PREFILL),
        (2, ROLE_DECODE),
    ]
    assert len(c.tracker) == 0


def test_aggregated_fleet_has_no_hop():
    c = core(inst(1, "aggregated"), inst(2, "aggregated"))
    assert c.route(req("r", tokens=1000), now=0).response.prefill_instance_id is None


def test_prefill_worker_speaks_the_decode_workers_protocol():
    vllm_prefill = Instance(
        instance_id=5,
        url="grpc://h:5",
        protocol="vllm",
        model="m",
        context_length=4096,
        block_size=16,
        role=ROLE_PREFILL,
    )
    c = core(vllm_prefill, inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE, local_prefill=False))
    for n in range(4):
        assert c.route(req(f"r{n}"), now=0).response.prefill_instance_id == 1


def test_decode_only_worker_without_a_prefill_of_its_protocol_is_skipped():
    vllm_decode = Instance(
        instance_id=6,
        url="grpc://h:6",
        protocol="vllm",
        model="m",
        context_length=4096,
        block_size=16,
        role=ROLE_DECODE,
        local_prefill=False,
    )
    c = core(inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE, local_prefill=False), vllm_decode)
    for n in range(4):
        reply = c.route(req(f"r{n}"), now=0).response
        assert (reply.instance_id, reply.prefill_instance_id) == (2, 1)


def test_dry_run_lists_prefill_candidates_when_the_hop_is_skipped():
    c = core(inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE))
    reply = c.route(req("d", tokens=10, dry_run=True), now=0).response
    assert reply.prefill_instance_id is None
    assert {w.role for w in reply.workers} == {ROLE_PREFILL, ROLE_DECODE}
