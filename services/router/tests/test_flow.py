"""The router's flow gate on its wire (a real ROUTER socket, over ipc): admissions answered
at once or when units free, each to the preprocessor that asked; syncs; objectives judged by
the time model; expiry on the event loop; the gate's metrics; a router without a gate."""

import asyncio
import random

import pytest
import zmq

from switchyard.common.flow.config import from_mapping
from switchyard.common.messaging import LoopSocket, new_socket
from switchyard.protos import codec
from switchyard.protos.messages import (
    FlowAdmit,
    FlowDecision,
    FlowHeld,
    FlowRelease,
    FlowStatus,
    FlowStatusRequest,
    FlowSync,
    Instance,
)
from switchyard.router.config import preset
from switchyard.router.core import RouterCore
from switchyard.router.service import RouterService

pytestmark = pytest.mark.timeout(30)

A = Instance(
    instance_id=1, url="grpc://h:1", protocol="sglang", model="m", context_length=4096,
    block_size=16,
)  # fmt: skip


@pytest.fixture
async def wired(tmp_path, request):
    """(service, dealer, dealer2): a router with a flow gate (max_running 1) and two peers."""
    raw_config = getattr(request, "param", {"max_running": 1, "burst": 0, "queue_timeout_s": 0.5})
    core = RouterCore(preset("kv"), rng=random.Random(0))
    core.set_instances({1: A})
    endpoint = f"ipc://{tmp_path}/router"
    flow = from_mapping(raw_config) if raw_config else None
    service = RouterService(
        core, endpoint, "ipc://unused-control", "ipc://unused-events", flow=flow
    )
    raw = new_socket(service._ctx, zmq.ROUTER, bind=endpoint, sync=True)
    service._sock = LoopSocket(raw, service._on_message, multipart=True)
    dealers = [new_socket(service._ctx, zmq.DEALER, connect=[endpoint]) for _ in range(2)]
    try:
        yield service, *dealers
    finally:
        if service.flow is not None:
            service.flow.close()
        for dealer in dealers:
            dealer.close(linger=0)
        service._sock.close()
        service._ctx.term()


def admit(ticket: str, peer: str = "p1", **kw) -> FlowAdmit:
    return FlowAdmit(ticket=ticket, peer=peer, model="m", flow="f", **kw)


async def answer(dealer, timeout: float = 5.0) -> list:
    async with asyncio.timeout(timeout):
        reply = codec.route_response.decode(await dealer.recv())
    return reply if isinstance(reply, list) else [reply]


async def nothing(dealer) -> bool:
    try:
        await answer(dealer, 0.2)
    except TimeoutError:
        return True
    return False


class TestWire:
    async def test_queued_until_released_and_told_to_the_asker(self, wired):
        service, p1, p2 = wired
        await p1.send(codec.encode(admit("a")))
        [d] = await answer(p1)
        assert isinstance(d, FlowDecision) and d.request_id == "a" and d.admitted
        await p2.send(codec.encode(admit("b", peer="p2")))
        assert await nothing(p2)  # queued
        await p1.send(codec.encode(FlowRelease("a", tokens=10)))
        [d] = await answer(p2)
        assert d.request_id == "b" and d.admitted and d.wait_ms > 0 and d.peers == 2
        assert await nothing(p1)

    async def test_a_release_of_a_waiting_ticket_cancels_it(self, wired):
        service, p1, _ = wired
        await p1.send(codec.encode([admit("a"), admit("b")]))
        [d] = await answer(p1)
        assert d.request_id == "a"
        await p1.send(codec.encode([FlowRelease("b"), FlowRelease("a")]))
        assert await nothing(p1)
        assert service.flow is not None and service.flow.gate.running == 0

    async def test_queue_timeout_on_the_event_loop(self, wired):
        service, p1, _ = wired
        await p1.send(codec.encode([admit("a"), admit("b")]))
        [d] = await answer(p1)
        [d] = await answer(p1)  # 0.5 s later
        assert d.request_id == "b" and not d.admitted and d.reason == "queue_timeout"
        assert d.retry_after_s > 0 and "retry later" in d.message

    async def test_a_sync_repairs_a_lost_release(self, wired, monkeypatch):
        service, p1, _ = wired
        monkeypatch.setattr("switchyard.common.flow.gate.SYNC_GRACE_S", 0.0)
        await p1.send(codec.encode([admit("a"), admit("b")]))
        [d] = await answer(p1)
        await p1.send(codec.encode(FlowSync(peer="p1", held=[])))  # "a" ended, unsaid
        [d] = await answer(p1)
        assert d.request_id == "b" and d.admitted

    async def test_a_sync_adopts_what_another_gate_admitted(self, wired):
        service, p1, _ = wired
        await p1.send(codec.encode(FlowSync(peer="p1", held=[FlowHeld("x", "f", 0, 1, 10)])))
        await p1.send(codec.encode(admit("a")))
        assert await nothing(p1)  # the slot is x's
        await p1.send(codec.encode(FlowRelease("x")))
        [d] = await answer(p1)
        assert d.request_id == "a" and d.admitted

    async def test_status(self, wired):
        service, p1, _ = wired
        await p1.send(codec.encode([admit("a"), admit("b"), FlowStatusRequest("s")]))
        replies = await answer(p1)
        replies += await answer(p1)
        [status] = [r for r in replies if isinstance(r, FlowStatus)]
        assert status.state is not None
        assert status.state["running"] == 1 and status.state["queued"] == 1
        assert status.state["waiting"][0]["ticket"] == "b"


class TestObjective:
    async def test_the_time_model_refuses_what_no_engine_can_start_in_time(self, wired):
        service, p1, _ = wired
        # The time model's prior: 25 ms base + 50 ms per 1k prompt tokens.
        prompt = list(range(4000))
        await p1.send(codec.encode(admit("a", objective_ms=100.0, token_ids=prompt)))
        [d] = await answer(p1)
        assert not d.admitted and d.reason == "ttft_objective"
        assert d.predicted_ttft_ms == pytest.approx(225.0, rel=0.05)
        await p1.send(codec.encode(admit("b", objective_ms=1000.0, token_ids=prompt)))
        [d] = await answer(p1)
        assert d.admitted


class TestMetrics:
    async def test_series(self, wired):
        service, p1, _ = wired
        await p1.send(codec.encode([admit("a"), admit("b")]))
        await answer(p1)
        await answer(p1)  # b's queue timeout
        registry = service.metrics.registry
        labels = {"priority": "default", "flow": "other"}
        assert registry.get_sample_value("switchyard_router_flow_admitted_total", labels) == 1
        assert registry.get_sample_value("switchyard_router_flow_running", labels) == 1
        shed = {**labels, "reason": "queue_timeout"}
        assert registry.get_sample_value("switchyard_router_flow_shed_total", shed) == 1
        assert registry.get_sample_value("switchyard_router_flow_wait_seconds_count", labels) == 1
        assert registry.get_sample_value("switchyard_router_flow_peers") == 1


@pytest.mark.parametrize("wired", [None], indirect=True)
async def test_a_router_without_a_gate_says_so(wired):
    service, p1, _ = wired
    await p1.send(codec.encode([admit("a"), FlowStatusRequest("s")]))
    replies = await answer(p1)
    replies += [] if len(replies) == 2 else await answer(p1)
    decision = next(r for r in replies if isinstance(r, FlowDecision))
    assert not decision.admitted and decision.reason == "no_gate"
    status = next(r for r in replies if isinstance(r, FlowStatus))
    assert status.state is None
