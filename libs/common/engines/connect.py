"""Open a channel to an engine URL and learn which family it speaks.

Detection calls HealthCheck on each family's service: the engine answers its own and says
UNIMPLEMENTED for the other's.
"""

from __future__ import annotations

import grpc

from switchyard.common import errors
from switchyard.common.engines.base import CHANNEL_OPTIONS, EngineClient
from switchyard.common.engines.sglang import SglangClient
from switchyard.common.engines.vllm import VllmClient
from switchyard.common.errors import EngineError
from switchyard.common.instance_id import grpc_target
from switchyard.protos.messages import PROTOCOL_SGLANG, PROTOCOL_VLLM

CLIENTS: dict[str, type[EngineClient]] = {PROTOCOL_SGLANG: SglangClient, PROTOCOL_VLLM: VllmClient}


def open_channel(url: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(grpc_target(url), options=CHANNEL_OPTIONS)


def client_for(protocol: str, url: str, instance_id: int | None = None) -> EngineClient:
    """A client for an engine whose family is already known (the dispatcher's case)."""
    return CLIENTS[protocol](open_channel(url), instance_id)


async def connect(url: str, timeout: float = 3.0, instance_id: int | None = None) -> EngineClient:
    """Detect the family of the engine at `url`. Raises EngineError (cannot_connect when the
    engine does not answer, bad_request when it speaks neither family)."""
    channel = open_channel(url)
    try:
        for cls in (SglangClient, VllmClient):
            client = cls(channel, instance_id)
            try:
                await client.health(timeout)
            except EngineError as exc:
                if exc.kind == errors.BAD_REQUEST:  # UNIMPLEMENTED: not this family
                    continue
                raise
            return client
    except BaseException:
        await channel.close()
        raise
    await channel.close()
    raise EngineError(errors.BAD_REQUEST, f"{url} speaks neither SGLang nor vLLM gRPC", instance_id)
