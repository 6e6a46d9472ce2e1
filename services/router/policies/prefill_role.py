"""Filter (prefill profile): prefill-role engines only."""

from __future__ import annotations

from switchyard.protos.messages import ROLE_PREFILL
from switchyard.router.types import Needs, RouteContext, Worker


class PrefillRole:
    name = "prefill_role"
    needs = Needs.NONE

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        return [w for w in workers if w.instance.role == ROLE_PREFILL]
