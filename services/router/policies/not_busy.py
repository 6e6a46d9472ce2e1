"""Filter: not an engine that answered RESOURCE_EXHAUSTED within its back-off. When every one
is busy this leaves nothing: the core answers `all_busy` (the caller returns 529/503)."""

from __future__ import annotations

from switchyard.router.types import Needs, RouteContext, Worker


class NotBusy:
    name = "not_busy"
    needs = Needs.NONE

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        busy = ctx.busy
        if not busy:
            return workers
        now = ctx.now
        return [w for w in workers if busy.get(w.instance.instance_id, 0.0) <= now]
