"""Filter: a decode-only engine (it cannot prefill itself) needs a routable prefill engine of
its protocol to hand it the KV; engines that prefill themselves always pass."""

from __future__ import annotations

from switchyard.router.types import Needs, RouteContext, Worker


class PrefillReachable:
    name = "prefill_reachable"
    needs = Needs.NONE

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        hop = ctx.hop_protocols
        return [w for w in workers if w.instance.local_prefill or w.instance.protocol in hop]
