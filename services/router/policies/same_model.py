"""Filter: workers serving the request's model."""

from __future__ import annotations

from switchyard.router.types import Needs, RouteContext, Worker


class SameModel:
    name = "same_model"
    needs = Needs.NONE

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        model = ctx.request.model
        return [w for w in workers if w.instance.model == model]
