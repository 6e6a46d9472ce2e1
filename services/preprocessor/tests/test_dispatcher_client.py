"""DispatcherClient against real ZMQ: a stream waits (bounded) for a dispatcher to come."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from switchyard.common.ports import free_port
from switchyard.preprocessor.dispatcher_client import DispatcherClient, NoDispatcher
from switchyard.protos import codec
from switchyard.protos.messages import GenerateRequest, SamplingParams

REQUEST = GenerateRequest(
    request_id="r", instance_id=1, token_ids=[1, 2], sampling=SamplingParams(max_tokens=2)
)


class TestOpen:
    """Issue 14: the only dispatcher restarting failed every stream ("no dispatcher is
    reachable") after the route timeout, while `up` takes up to 10 s to restart it."""

    async def test_open_waits_for_a_dispatcher_that_comes_up(self):
        endpoint = f"tcp://127.0.0.1:{free_port()}"  # bound in this process, below
        client = DispatcherClient([endpoint], wait_s=60)
        ctx = zmq.asyncio.Context()
        server = ctx.socket(zmq.ROUTER)
        server.setsockopt(zmq.LINGER, 0)
        try:
            client.start()
            opening = asyncio.ensure_future(client.open(REQUEST))
            await asyncio.sleep(0.5)
            assert not opening.done()  # nobody there yet: it waits
            server.bind(endpoint)  # the dispatcher is back
            async with asyncio.timeout(20):
                stream = await opening
                _, payload = await server.recv_multipart()
            assert codec.dispatcher_request.decode(payload).request_id == "r"
            stream.close()
        finally:
            await client.close()
            server.close(linger=0)
            ctx.term()

    async def test_open_gives_up_after_the_wait(self):
        client = DispatcherClient([f"tcp://127.0.0.1:{free_port()}"], wait_s=0.2)
        try:
            client.start()
            with pytest.raises(NoDispatcher, match="waited 0.2s"):
                await client.open(REQUEST)
        finally:
            await client.close()


class TestBatching:
    async def test_the_first_start_of_an_iteration_goes_at_once_the_rest_and_cancels_as_a_list(
        self, tmp_path
    ):
        endpoint = f"ipc://{tmp_path}/dispatcher"
        ctx = zmq.asyncio.Context()
        server = ctx.socket(zmq.ROUTER)
        server.setsockopt(zmq.LINGER, 0)
        server.bind(endpoint)
        client = DispatcherClient([endpoint])

        def request(rid: str) -> GenerateRequest:
            return GenerateRequest(
                request_id=rid, instance_id=1, token_ids=[1], sampling=SamplingParams(max_tokens=2)
            )

        async def received(count: int) -> list[object]:
            got = []
            async with asyncio.timeout(10):
                for _ in range(count):
                    _, payload = await server.recv_multipart()
                    got.append(codec.dispatcher_request.decode(payload))
            return got

        try:
            client.start()
            assert await client.wait_connected(10)
            streams = await asyncio.gather(*(client.open(request(rid)) for rid in "abc"))
            first, rest = await received(2)
            assert first == request("a")  # sent before the loop ran anything else
            assert [m.request_id for m in rest] == ["b", "c"]
            await asyncio.gather(*(stream.cancel() for stream in streams))
            [cancels] = await received(1)
            assert [(type(m).__name__, m.request_id) for m in cancels] == [
                ("CancelRequest", rid) for rid in "abc"
            ]
        finally:
            await client.close()
            server.close(linger=0)
            ctx.term()
