"""The routing decision: filter candidates (model, role, exclusions), then ask the policy.

Pure and synchronous: the service passes `now`, so tests need no clock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from switchyard.protos.messages import (
    ROLE_PREFILL,
    STAGE_FINISHED,
    STAGE_FIRST_TOKEN,
    Instance,
    RouteProgress,
    RouteRequest,
    RouteResponse,
)
from switchyard.router.load import InFlightTracker
from switchyard.router.types import Policy, RouteContext, WorkerView

log = logging.getLogger(__name__)

NO_WORKER = "no_worker"
UNKNOWN_MODEL = "unknown_model"


class RouterCore:
    def __init__(self, policy: Policy, tracker: InFlightTracker | None = None) -> None:
        self.policy = policy
        self.tracker = tracker or InFlightTracker()
        self._instances: Mapping[int, Instance] = {}

    def set_instances(self, instances: Mapping[int, Instance]) -> None:
        """Swap in a new instance snapshot; forget the load of instances that left."""
        for gone in set(self._instances) - set(instances):
            self.tracker.drop_instance(gone)
        self._instances = instances

    def candidates(self, model: str, exclude: frozenset[int]) -> list[WorkerView]:
        tracker = self.tracker
        return [
            WorkerView(
                instance_id=i.instance_id,
                url=i.url,
                model=i.model,
                role=i.role,
                in_flight=tracker.in_flight(i.instance_id),
                in_prefill=tracker.in_prefill(i.instance_id),
            )
            for i in self._instances.values()
            # Prefill-only engines take the prefill hop, never a whole request.
            if i.model == model and i.role != ROLE_PREFILL and i.instance_id not in exclude
        ]

    def route(self, request: RouteRequest, now: float) -> RouteResponse:
        self.tracker.expire(now)
        candidates = self.candidates(request.model, frozenset(request.exclude))
        if not candidates:
            known = any(i.model == request.model for i in self._instances.values())
            return RouteResponse(
                request_id=request.request_id,
                instance_id=None,
                error=NO_WORKER if known or request.exclude else UNKNOWN_MODEL,
            )
        ctx = RouteContext(request.request_id, request.model, request.token_ids)
        chosen = self.policy.pick(candidates, ctx)
        self.tracker.add(request.request_id, chosen.instance_id, now)
        log.debug(
            "route request_id=%s instance_id=%d policy=%s",
            request.request_id,
            chosen.instance_id,
            self.policy.name,
        )
        return RouteResponse(request_id=request.request_id, instance_id=chosen.instance_id)

    def progress(self, notice: RouteProgress) -> None:
        if notice.stage == STAGE_FIRST_TOKEN:
            self.tracker.first_token(notice.request_id)
        elif notice.stage == STAGE_FINISHED:
            self.tracker.finish(notice.request_id)
