"""Filter (prefill profile): the KV moves between engines of one protocol only, so a prefill
engine must speak the chosen decode engine's."""

from __future__ import annotations

from switchyard.router.types import Needs, RouteContext, Worker


class SameProtocol:
    name = "same_protocol"
    needs = Needs.NONE

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        protocol = ctx.decode_protocol
        return [w for w in workers if w.instance.protocol == protocol]
