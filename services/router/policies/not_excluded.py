"""Filter: not an instance that already failed this request (a migration's exclusions)."""

from __future__ import annotations

from switchyard.router.types import Needs, RouteContext, Worker


class NotExcluded:
    name = "not_excluded"
    needs = Needs.NONE

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        exclude = ctx.request.exclude
        if not exclude:
            return workers
        return [w for w in workers if w.instance.instance_id not in exclude]
