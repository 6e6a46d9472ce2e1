"""RouterClient against a fake router on a real ROUTER socket (ipc): what goes over the wire."""

import asyncio

import pytest
import zmq
import zmq.asyncio
from support.loopback import common_free_port

from switchyard.preprocessor.router_client import RouterClient
from switchyard.protos import codec
from switchyard.protos.messages import (
    STAGE_FINISHED,
    STAGE_FIRST_TOKEN,
    InstanceBusy,
    RouteProgress,
    RouteRequest,
    RouteResponse,
)


def req(rid: str) -> RouteRequest:
    return RouteRequest(request_id=rid, model="m", token_ids=[1, 2, 3])


class FakeRouter:
    """Records every message (decoded) and answers the route requests in it, in reverse order
    so that replies are matched by request id, not by position."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.messages: list[object] = []
        self.task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            identity, payload = await self.sock.recv_multipart()
            message = codec.router_request.decode(payload)
            self.messages.append(message)
            batch = message if isinstance(message, list) else [message]
            replies = [
                RouteResponse(request_id=m.request_id, instance_id=7)
                for m in reversed(batch)
                if isinstance(m, RouteRequest)
            ]
            if replies:
                answer = replies if isinstance(message, list) else replies[0]
                await self.sock.send_multipart([identity, codec.encode(answer)])

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.sock.close(linger=0)


@pytest.fixture
async def wired(tmp_path):
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tmp_path}/router"
    router = FakeRouter(ctx, endpoint)
    client = RouterClient([endpoint], dict)
    client.start()
    try:
        assert await client.wait_connected(10)
        yield client, router
    finally:
        await client.close()
        await router.close()
        ctx.term()


class TestBatching:
    async def test_the_first_request_of_an_iteration_goes_at_once_the_rest_as_one_list(self, wired):
        """The first route request waited for the next loop iteration too (issue 13: under
        load, for everything else the loop had to do first); the rest still go as one list."""
        client, router = wired
        replies = await asyncio.gather(*(client.route(req(rid), 5.0) for rid in "abcd"))
        assert [r.request_id for r in replies] == ["a", "b", "c", "d"]
        assert all(r.instance_id == 7 for r in replies)
        assert router.messages[0] == req("a")
        assert [m.request_id for m in router.messages[1]] == ["b", "c", "d"]
        assert len(router.messages) == 2

    async def test_a_request_is_sent_before_the_loop_runs_anything_else(self, wired):
        client, router = wired
        task = asyncio.create_task(client.route(req("now"), 5.0))
        await asyncio.sleep(0)  # the task runs up to its wait for the reply
        assert not client.replicas.live[0]._queued  # already handed to the socket, not held back
        assert (await task).request_id == "now"
        assert router.messages == [req("now")]

    async def test_a_lone_request_goes_as_itself(self, wired):
        client, router = wired
        reply = await client.route(req("solo"), 5.0)
        assert reply.request_id == "solo" and reply.instance_id == 7
        assert router.messages == [req("solo")]

    async def test_the_next_iteration_sends_its_first_request_at_once_again(self, wired):
        client, router = wired
        await client.route(req("a"), 5.0)
        await client.route(req("b"), 5.0)
        assert router.messages == [req("a"), req("b")]

    async def test_notices_join_the_list_in_the_order_they_were_made(self, wired):
        client, router = wired
        await client.route(req("a"), 5.0)  # the router that routed `a` gets its notices
        await asyncio.gather(
            client.progress("a", 7, STAGE_FIRST_TOKEN, final=False),
            client.busy(3, 1.0),
            client.progress("a", 7, STAGE_FINISHED, final=True),
        )
        async with asyncio.timeout(5):
            while len(router.messages) < 2:
                await asyncio.sleep(0.001)
        assert router.messages[1] == [
            RouteProgress("a", 7, STAGE_FIRST_TOKEN),
            InstanceBusy(3, 1.0),
            RouteProgress("a", 7, STAGE_FINISHED),
        ]

    async def test_notices_queued_before_a_request_go_with_it_first(self, wired):
        client, router = wired
        await client.route(req("a"), 5.0)
        await client.progress("a", 7, STAGE_FIRST_TOKEN, final=False)  # queued
        reply = await client.route(req("b"), 5.0)  # goes at once, the notice ahead of it
        assert reply.request_id == "b"
        assert router.messages[1] == [RouteProgress("a", 7, STAGE_FIRST_TOKEN), req("b")]


class TestNameWithReplicas:
    async def test_a_retired_router_gets_the_notices_of_what_it_routed_then_closes(self):
        """A router name resolving to two addresses (an injected resolver): both route in
        turn; once one leaves the name it routes nothing new, the requests it routed still
        report their progress to it, and it is closed after their last notice."""
        names = {"routers.test": ["127.0.0.2", "127.0.0.3"]}

        async def resolve(host: str) -> list[str]:
            return list(names[host])

        ctx = zmq.asyncio.Context()
        port = common_free_port()
        routers = {h: FakeRouter(ctx, f"tcp://{h}:{port}") for h in names["routers.test"]}
        client = RouterClient([f"tcp://routers.test:{port}"], dict, resolve=resolve)
        client.start()
        try:
            assert await client.wait_connected(10)
            async with asyncio.timeout(10):
                while (
                    not all(r.connected for r in client.replicas.live)
                    or len(client.replicas.live) < 2
                ):
                    await asyncio.sleep(0.01)
            for rid in "abcd":
                await client.route(req(rid), 5.0)
            got = {h: [m.request_id for m in r.messages] for h, r in routers.items()}
            assert got == {"127.0.0.2": ["a", "c"], "127.0.0.3": ["b", "d"]}

            names["routers.test"] = ["127.0.0.3"]
            await client.replicas.refresh()
            [retired] = client.replicas.retired
            for rid in "ef":
                await client.route(req(rid), 5.0)
            assert [m.request_id for m in routers["127.0.0.3"].messages][-2:] == ["e", "f"]
            await client.progress("a", 7, STAGE_FINISHED, final=True)
            await client.replicas.refresh()
            assert client.replicas.retired == (retired,)  # `c` still runs
            await client.progress("c", 7, STAGE_FINISHED, final=True)
            async with asyncio.timeout(5):
                while len(routers["127.0.0.2"].messages) < 4:
                    await asyncio.sleep(0.001)
            assert routers["127.0.0.2"].messages[2:] == [
                RouteProgress("a", 7, STAGE_FINISHED),
                RouteProgress("c", 7, STAGE_FINISHED),
            ]
            await client.replicas.refresh()
            assert client.replicas.retired == ()
        finally:
            await client.close()
            for router in routers.values():
                await router.close()
            ctx.term()
