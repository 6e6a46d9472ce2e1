"""Filter: engines that take a whole request (prefill-only engines take the prefill hop)."""

from __future__ import annotations

from switchyard.protos.messages import ROLE_PREFILL
from switchyard.router.types import Needs, RouteContext, Worker


class ServesRequests:
    name = "serves_requests"
    needs = Needs.NONE

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        return [w for w in workers if w.instance.role != ROLE_PREFILL]
