"""RequestReplyClient against a real ZMQ ROUTER that dies under a pending call."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from switchyard.common.messaging import ConnectionLost, RequestReplyClient, bound_endpoint
from switchyard.protos import codec
from switchyard.protos.messages import RouteRequest


class TestConnectionDrop:
    """Issue 14: killing a router stalled every request whose route call was in flight for
    the full route timeout: pending calls were not failed when the connection dropped."""

    async def test_a_pending_call_fails_at_once_when_the_service_goes_away(self):
        ctx = zmq.asyncio.Context()
        server = ctx.socket(zmq.ROUTER)
        server.setsockopt(zmq.LINGER, 0)
        server.bind("tcp://127.0.0.1:*")
        client = RequestReplyClient(
            bound_endpoint(server), codec.route_response, key=lambda r: r.request_id
        )
        try:
            client.start()
            assert await client.wait_connected(10)
            call = asyncio.ensure_future(
                client.call("r1", RouteRequest(request_id="r1", model="m", token_ids=[1]), 60)
            )
            await server.recv_multipart()  # it arrived; the service dies without answering
            server.close(linger=0)
            async with asyncio.timeout(10):  # far below the call's 60 s timeout
                with pytest.raises(ConnectionLost):
                    await call
        finally:
            await client.close()
            ctx.term()
