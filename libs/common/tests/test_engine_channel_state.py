"""How a grpc.aio call's UNAVAILABLE is judged from its channel's state (EngineClient._error):
an engine's refusal leaves the channel READY; a lost connection takes it out of READY, which
gRPC core may report only after the call's error, so a READY channel is given a moment.
That a refusal is `refused` and a lost connection `cannot_connect`: test_engine_streams."""

import asyncio
import contextlib

import grpc
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sgrpc

from switchyard.common import errors
from switchyard.common.engines.connect import client_for
from switchyard.common.errors import EngineError


class Draining(sgrpc.SglangSchedulerServicer):
    """Refuses every HealthCheck UNAVAILABLE over a connection that stays up."""

    def __init__(self) -> None:
        self.answered = asyncio.Event()

    async def HealthCheck(self, request, context):
        self.answered.set()
        await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")


@contextlib.asynccontextmanager
async def draining_engine():
    servicer = Draining()
    server = grpc.aio.server()
    sgrpc.add_SglangSchedulerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, client_for("sglang", f"grpc://127.0.0.1:{port}", 1)
    finally:
        await server.stop(None)


async def test_a_client_closed_while_a_refusal_is_judged_is_disconnected():
    """Closing leaves the channel SHUTDOWN, not READY: without a look at `closed` the refusal
    would pass for a lost connection (cannot_connect: the instance reported down)."""
    async with draining_engine() as (servicer, client):
        call = asyncio.ensure_future(client.health(2.0))
        await servicer.answered.wait()
        await asyncio.sleep(0.01)  # the refusal reaches the client: inside the 50 ms wait
        await client.close()
        with pytest.raises(EngineError) as info:
            await call
    assert info.value.kind == errors.DISCONNECTED
