"""Filter: engines whose protocol can honour every field the request needs (`requires`:
today `seed`, which SGLang's gRPC API cannot carry; see switchyard.common.capabilities)."""

from __future__ import annotations

from switchyard.common.capabilities import can_honour
from switchyard.router.types import Needs, RouteContext, Worker


class Capable:
    name = "capable"
    needs = Needs.NONE

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        requires = ctx.request.requires
        if not requires:
            return workers
        return [w for w in workers if can_honour(w.instance.protocol, requires)]
