"""RouterClient's failover between router replicas and the local fallback."""

from __future__ import annotations

from switchyard.common.messaging import ConnectionLost
from switchyard.preprocessor import router_client
from switchyard.preprocessor.router_client import FALLBACK_POLICY, RouterClient
from switchyard.protos.messages import Instance, RouteRequest, RouteResponse

INSTANCE = Instance(
    instance_id=3, url="grpc://127.0.0.1:1", protocol="vllm", model="m",
    context_length=100, block_size=16,
)  # fmt: skip
REQUEST = RouteRequest(request_id="r", model="m", token_ids=[1, 2])


class FakeRouter:
    """A connected router replica whose call answers, times out or loses its connection."""

    def __init__(self, endpoint: str, behaviour: str) -> None:
        self.endpoint = endpoint
        self.behaviour = behaviour
        self.connected = True
        self.suspect_until = 0.0
        self.calls = 0

    async def call(self, request_id, message, timeout):
        self.calls += 1
        if self.behaviour == "timeout":
            raise TimeoutError
        if self.behaviour == "lost":
            raise ConnectionLost(f"lost connection to {self.endpoint}")
        return RouteResponse(request_id=request_id, instance_id=3, policy="kv")


async def client_with(*routers: FakeRouter) -> RouterClient:
    client = RouterClient(["tcp://127.0.0.1:1"], lambda: {3: INSTANCE})
    await client.close()  # its real replica is not used
    client.replicas.live = routers  # type: ignore[assignment]
    return client


class TestFailover:
    async def test_a_dropped_connection_goes_to_the_next_router_at_once(self):
        lost, good = FakeRouter("a", "lost"), FakeRouter("b", "ok")
        reply = await (await client_with(lost, good)).route(REQUEST, 5.0)
        assert reply.policy == "kv" and lost.calls == 1 and good.calls == 1

    async def test_with_no_router_left_the_local_fallback_routes(self):
        reply = await (await client_with(FakeRouter("a", "lost"))).route(REQUEST, 5.0)
        assert reply.policy == FALLBACK_POLICY and reply.instance_id == 3

    async def test_a_router_that_timed_out_is_skipped_for_a_while(self, monkeypatch):
        """A frozen router (SIGSTOP) must not cost every request the route timeout."""
        now = [100.0]
        monkeypatch.setattr(router_client.time, "monotonic", lambda: now[0])
        frozen = FakeRouter("a", "timeout")
        client = await client_with(frozen)
        assert (await client.route(REQUEST, 1.0)).policy == FALLBACK_POLICY
        for _ in range(5):
            assert (await client.route(REQUEST, 1.0)).policy == FALLBACK_POLICY
        assert frozen.calls == 1
        now[0] += router_client.SUSPECT_S + 0.1  # then it is tried again
        frozen.behaviour = "ok"
        assert (await client.route(REQUEST, 1.0)).policy == "kv"
        assert frozen.calls == 2


class TestLocalFallback:
    def test_a_request_that_needs_a_seed_goes_only_to_engines_that_carry_one(self):
        sglang = Instance(
            instance_id=1, url="grpc://127.0.0.1:2", protocol="sglang", model="m",
            context_length=100, block_size=16,
        )  # fmt: skip
        fallback = router_client.LocalFallback(lambda: {1: sglang, 3: INSTANCE})
        seeded = RouteRequest(request_id="s", model="m", token_ids=[1], requires=["seed"])
        assert {fallback.route(seeded).instance_id for _ in range(4)} == {3}
        assert {fallback.route(REQUEST).instance_id for _ in range(4)} == {1, 3}
        only_sglang = router_client.LocalFallback(lambda: {1: sglang})
        assert only_sglang.route(seeded).error == "no_worker"
