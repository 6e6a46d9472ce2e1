"""The preprocessor's side of the router channel: route requests and progress notices."""

from __future__ import annotations

from switchyard.common.messaging import RequestReplyClient
from switchyard.protos import codec
from switchyard.protos.messages import RouteProgress, RouteRequest, RouteResponse


class RouterClient(RequestReplyClient):
    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint, codec.route_response, key=lambda r: r.request_id)

    async def route(self, request: RouteRequest, timeout: float) -> RouteResponse:
        return await self.call(request.request_id, request, timeout)

    async def progress(self, request_id: str, instance_id: int, stage: str) -> None:
        await self.send(RouteProgress(request_id, instance_id, stage))
