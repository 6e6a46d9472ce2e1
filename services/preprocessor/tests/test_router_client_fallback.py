"""RouterClient's local fallback (no router answers): the router's own candidate filters,
then round-robin."""

from switchyard.preprocessor.router_client import FALLBACK_POLICY, LocalFallback
from switchyard.protos.messages import (
    ROLE_DECODE,
    ROLE_PREFILL,
    Instance,
    RouteRequest,
)


def inst(iid, model="m", role="aggregated", local_prefill=True):
    return Instance(
        instance_id=iid,
        url=f"grpc://h:{iid}",
        protocol="sglang",
        model=model,
        context_length=1024,
        block_size=16,
        role=role,
        local_prefill=local_prefill,
    )


def route(fallback, exclude=(), model="m"):
    return fallback.route(
        RouteRequest(request_id="r", model=model, token_ids=[1, 2], exclude=list(exclude))
    )


class TestLocalFallback:
    def test_filters_as_the_router_does(self):
        instances = {
            1: inst(1),
            2: inst(2, model="other"),
            3: inst(3, role=ROLE_PREFILL),
            4: inst(4, role=ROLE_DECODE, local_prefill=False),  # needs a hop: none here
            5: inst(5),
        }
        fallback = LocalFallback(lambda: instances)
        picks = {route(fallback).instance_id for _ in range(6)}
        assert picks == {1, 5}
        assert route(fallback).policy == FALLBACK_POLICY
        assert {route(fallback, exclude=[1]).instance_id for _ in range(3)} == {5}

    def test_no_candidate(self):
        fallback = LocalFallback(lambda: {1: inst(1)})
        reply = route(fallback, model="nope")
        assert (reply.instance_id, reply.error) == (None, "no_worker")
