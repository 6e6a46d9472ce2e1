"""Filter: engines that prefill their own prompts (for routing without a prefill hop, such as
the preprocessor's fallback when no router answers)."""

from __future__ import annotations

from switchyard.router.types import Needs, RouteContext, Worker


class LocalPrefill:
    name = "local_prefill"
    needs = Needs.NONE

    def filter(self, ctx: RouteContext, workers: list[Worker]) -> list[Worker]:
        return [w for w in workers if w.instance.local_prefill]
