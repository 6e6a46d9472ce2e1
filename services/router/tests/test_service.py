"""RouterService's wire: its ROUTER socket (a real one, over ipc) answering a DEALER, a lone
message or a list of them. Fleet is not involved: the instances are set on the core."""

import asyncio
import random

import pytest
import zmq

from switchyard.common.messaging import LoopSocket, new_socket
from switchyard.protos import codec
from switchyard.protos.messages import (
    STAGE_FINISHED,
    Instance,
    InstanceBusy,
    RouteProgress,
    RouteRequest,
    RouteResponse,
)
from switchyard.router.config import preset
from switchyard.router.core import RouterCore
from switchyard.router.service import RouterService

A, B = (
    Instance(
        instance_id=iid,
        url=f"grpc://h:{iid}",
        protocol="sglang",
        model="m",
        context_length=1024,
        block_size=16,
    )
    for iid in (1, 2)
)


def req(rid: str) -> RouteRequest:
    return RouteRequest(request_id=rid, model="m", token_ids=[1, 2, 3])


@pytest.fixture
async def wired(tmp_path):
    """(service, dealer): the service's message handler on a bound ROUTER, a DEALER to it."""
    core = RouterCore(preset("least_loaded"), rng=random.Random(0))
    core.set_instances({A.instance_id: A, B.instance_id: B})
    endpoint = f"ipc://{tmp_path}/router"
    service = RouterService(core, endpoint, "ipc://unused-control", "ipc://unused-events")
    raw = new_socket(service._ctx, zmq.ROUTER, bind=endpoint, sync=True)
    service._sock = LoopSocket(raw, service._on_message, multipart=True)
    dealer = new_socket(service._ctx, zmq.DEALER, connect=[endpoint])
    try:
        yield service, dealer
    finally:
        dealer.close(linger=0)
        service._sock.close()
        service._ctx.term()


async def answer(dealer) -> object:
    async with asyncio.timeout(5):
        return codec.route_response.decode(await dealer.recv())


class TestWire:
    async def test_a_list_of_requests_is_answered_by_one_list_in_order(self, wired):
        service, dealer = wired
        await dealer.send(codec.encode([req("a"), req("b"), req("c")]))
        replies = await answer(dealer)
        assert isinstance(replies, list)
        assert [r.request_id for r in replies] == ["a", "b", "c"]
        assert all(r.instance_id in (1, 2) for r in replies)
        # least_loaded spreads them: the bookings of a list are made one after another
        assert {r.instance_id for r in replies[:2]} == {1, 2}

    async def test_a_lone_request_gets_a_lone_reply(self, wired):
        _, dealer = wired
        await dealer.send(codec.encode(req("solo")))
        reply = await answer(dealer)
        assert isinstance(reply, RouteResponse)
        assert reply.request_id == "solo" and reply.instance_id in (1, 2)

    async def test_notices_in_a_list_are_applied_and_answer_nothing(self, wired):
        service, dealer = wired
        await dealer.send(codec.encode(req("a")))
        chosen = (await answer(dealer)).instance_id
        assert service.core.tracker.load((chosen, 0)).in_flight == 1
        other = 2 if chosen == 1 else 1
        await dealer.send(
            codec.encode([RouteProgress("a", chosen, STAGE_FINISHED), InstanceBusy(other, 60.0)])
        )
        # Both notices are applied before the request behind them: with `other` busy and
        # nothing in flight anywhere, `b` goes to `chosen`, and the only reply is b's.
        await dealer.send(codec.encode([req("b")]))
        replies = await answer(dealer)
        assert [(r.request_id, r.instance_id) for r in replies] == [("b", chosen)]

    async def test_an_undecodable_message_is_dropped_and_serving_goes_on(self, wired):
        _, dealer = wired
        await dealer.send(b"\xc1 not msgpack")
        await dealer.send(codec.encode([{"type": "nonsense"}]))
        await dealer.send(codec.encode(req("after")))
        reply = await answer(dealer)
        assert reply.request_id == "after"


def sample(service: RouterService, name: str, **labels: str) -> float:
    value = service.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


class TestAnswerFirst:
    """A decision's answer goes out before its metrics are recorded (issue 13: the asker
    waited on the metrics' prometheus calls too); the metrics themselves are unchanged."""

    async def test_the_answer_of_a_list_goes_before_any_of_its_metrics(self, wired):
        service, dealer = wired
        order: list[object] = []
        sock = service._sock
        assert sock is not None
        send, account = sock.send_multipart, service._account
        sock.send_multipart = lambda frames: (order.append("sent"), send(frames))[1]  # type: ignore[method-assign]
        service._account = lambda d: (order.append(d.request.request_id), account(d))[1]  # type: ignore[method-assign]
        await dealer.send(codec.encode([req("a"), RouteProgress("x", 1, STAGE_FINISHED), req("b")]))
        assert [r.request_id for r in await answer(dealer)] == ["a", "b"]
        await dealer.send(codec.encode(req("c")))
        assert (await answer(dealer)).request_id == "c"
        assert order == ["sent", "a", "b", "sent", "c"]

    async def test_the_metrics_of_each_decision_are_recorded(self, wired):
        service, dealer = wired
        await dealer.send(codec.encode([req("a"), req("b")]))
        await answer(dealer)
        dry = RouteRequest(request_id="d", model="m", token_ids=[1, 2, 3], dry_run=True)
        await dealer.send(codec.encode(dry))
        await answer(dealer)
        mode = service.core.mode
        assert sample(service, "switchyard_router_decisions_total", mode=mode, model="m") == 2
        assert sample(service, "switchyard_router_decision_seconds_count") == 3  # dry run too
