"""One call to fleet's admin API over its control socket (the preprocessor's /admin routes use it).

    reply = await fleet_admin(context, control, WorkerAdminRequest(action="list"))

A fresh DEALER per call: admin calls are rare, and a reply can then never be mistaken for
another call's. Raises FleetAdminError when fleet does not answer in time (or makes no sense).
"""

from __future__ import annotations

import msgspec
import zmq
import zmq.asyncio

from switchyard.common.errors import SwitchyardError
from switchyard.protos import codec
from switchyard.protos.messages import WorkerAdminReply, WorkerAdminRequest


class FleetAdminError(SwitchyardError):
    """Fleet did not answer an admin call (in time, or with a reply that makes sense)."""


async def fleet_admin(
    context: zmq.asyncio.Context,
    control_endpoint: str,
    request: WorkerAdminRequest,
    timeout: float = 5.0,
) -> WorkerAdminReply:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(control_endpoint)
        await sock.send(codec.encode(request))
        if not await sock.poll(int(timeout * 1000)):
            raise FleetAdminError(f"fleet at {control_endpoint} did not answer within {timeout:g}s")
        frames = await sock.recv_multipart()
        try:
            reply = codec.fleet_control_reply.decode(frames[-1])
        except msgspec.DecodeError as exc:
            raise FleetAdminError(f"fleet sent an undecodable admin reply: {exc}") from None
        if not isinstance(reply, WorkerAdminReply):
            raise FleetAdminError(f"fleet answered an admin call with {type(reply).__name__}")
        return reply
    finally:
        sock.close(linger=0)
