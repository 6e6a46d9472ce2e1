"""The routing decision: filter candidates (model, role, exclusions), look up KV overlap when
the policy asks for it, then ask the policy.

Pure and synchronous: the service passes `now`, so tests need no clock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from switchyard.common.block_hash import block_hashes
from switchyard.protos.messages import (
    ROLE_PREFILL,
    STAGE_FINISHED,
    STAGE_FIRST_TOKEN,
    Instance,
    RouteProgress,
    RouteRequest,
    RouteResponse,
    WorkerScore,
)
from switchyard.router.kv.index import KvIndex
from switchyard.router.load import InFlightTracker
from switchyard.router.predicted import PredictedPrefixes
from switchyard.router.types import Decision, Policy, RouteContext, WorkerView

log = logging.getLogger(__name__)

NO_WORKER = "no_worker"
# Disaggregation: a request whose uncached prompt on the chosen decode worker is shorter than
# this prefills there (no hop). A default, not measured: 256 tokens is where a prefill's
# compute starts to outweigh the hop's cost (a second engine call plus a KV transfer, a few
# ms) on typical GPUs, and it is the order of magnitude llm-d ships for its threshold.
DEFAULT_DISAGG_MIN_UNCACHED_TOKENS = 256
# The prefill hop's load booking lives under the request id with this suffix.
PREFILL_BOOKING = "#prefill"
ALL_BUSY = "all_busy"
UNKNOWN_MODEL = "unknown_model"


@dataclass(frozen=True, slots=True)
class Routed:
    """A decision with what the service needs for metrics."""

    response: RouteResponse
    decision: Decision | None


class RouterCore:
    def __init__(
        self,
        policy: Policy,
        tracker: InFlightTracker | None = None,
        index: KvIndex | None = None,
        predicted: PredictedPrefixes | None = None,
        disagg_min_uncached_tokens: int = DEFAULT_DISAGG_MIN_UNCACHED_TOKENS,
    ) -> None:
        if disagg_min_uncached_tokens < 0:
            raise ValueError("--disagg-min-uncached-tokens must be >= 0")
        self.disagg_min_uncached_tokens = disagg_min_uncached_tokens
        self.policy = policy
        self.tracker = tracker or InFlightTracker()
        self.index = index or KvIndex()
        self.predicted = predicted or PredictedPrefixes()
        self._busy: dict[int, float] = {}  # instance id -> busy until (RESOURCE_EXHAUSTED)
        self._instances: Mapping[int, Instance] = {}

    def set_instances(self, instances: Mapping[int, Instance]) -> None:
        """Swap in a new instance snapshot; forget the load of instances that left."""
        for gone in set(self._instances) - set(instances):
            self.tracker.drop_instance(gone)
            self.predicted.drop_instance(gone)
        self._instances = instances

    def route(self, request: RouteRequest, now: float) -> Routed:
        self.tracker.expire(now)
        if self._busy:
            self.expire_busy(now)
        exclude = frozenset(request.exclude)
        same_model = [
            i
            for i in self._instances.values()
            if i.model == request.model and i.instance_id not in exclude
        ]
        # Prefill-only engines take the prefill hop, never a whole request.
        instances = [i for i in same_model if i.role != ROLE_PREFILL]
        prefills = [
            i
            for i in same_model
            if i.role == ROLE_PREFILL and self._busy.get(i.instance_id, 0.0) <= now
        ]
        # A decode-only engine needs a prefill engine of its protocol to hand it the KV.
        hop_protocols = {i.protocol for i in prefills}
        instances = [i for i in instances if i.local_prefill or i.protocol in hop_protocols]
        if instances and self._busy:
            idle = [i for i in instances if self._busy.get(i.instance_id, 0.0) <= now]
            if not idle:
                return Routed(
                    RouteResponse(request_id=request.request_id, instance_id=None, error=ALL_BUSY),
                    None,
                )
            instances = idle
        if not instances:
            known = any(i.model == request.model for i in self._instances.values())
            error = NO_WORKER if known or request.exclude else UNKNOWN_MODEL
            return Routed(
                RouteResponse(request_id=request.request_id, instance_id=None, error=error), None
            )
        candidates, prompt_blocks, hashes = self._candidates(instances, request.token_ids, now)
        ctx = RouteContext(request.request_id, request.model, request.token_ids, prompt_blocks)
        decision = self.policy.pick(candidates, ctx)
        chosen = decision.chosen
        hop: WorkerView | None = None
        prefill_views: list[WorkerView] = []
        prefill_costs: dict[int, float] = {}
        chosen_protocol = self._instances[chosen.instance_id].protocol
        # The KV moves between engines of one protocol only.
        prefills = [i for i in prefills if i.protocol == chosen_protocol]
        needs_hop = bool(prefills) and self._needs_hop(chosen, request.token_ids)
        # Dry runs list the prefill candidates even when this request skips the hop.
        if needs_hop or (prefills and request.dry_run):
            prefill_views, p_blocks, p_hashes = self._candidates(prefills, request.token_ids, now)
            for size, values in p_hashes.items():
                hashes.setdefault(size, values)
            prompt_blocks = max(prompt_blocks, p_blocks)
            ctx = RouteContext(request.request_id, request.model, request.token_ids, prompt_blocks)
            hop, prefill_costs = self._pick_prefill(prefill_views, ctx)
            if not needs_hop:
                hop = None
        if not request.dry_run:
            chosen_size = self._instances[chosen.instance_id].block_size
            self.predicted.add(chosen.instance_id, hashes.get(chosen_size, ()), now)
            self.tracker.add(
                request.request_id,
                chosen.instance_id,
                now,
                # With a hop the decode worker receives the prompt's KV: nothing to prefill.
                prefill_blocks=0 if hop else prompt_blocks - chosen.overlap_blocks,
                blocks=prompt_blocks,
            )
            if hop is not None:
                hop_size = self._instances[hop.instance_id].block_size
                self.predicted.add(hop.instance_id, hashes.get(hop_size, ()), now)
                # Freed at the request's first token (the prefill is done by then).
                self.tracker.add(
                    request.request_id + PREFILL_BOOKING,
                    hop.instance_id,
                    now,
                    prefill_blocks=prompt_blocks - hop.overlap_blocks,
                    blocks=prompt_blocks,
                )
        log.debug(
            "route request_id=%s instance_id=%d policy=%s overlap=%d/%d",
            request.request_id,
            chosen.instance_id,
            self.policy.name,
            chosen.overlap_blocks,
            prompt_blocks,
        )
        workers = (
            [
                WorkerScore(
                    instance_id=w.instance_id,
                    url=w.url,
                    overlap_blocks=w.overlap_blocks,
                    in_flight=w.in_flight,
                    active_blocks=w.active_blocks,
                    prefill_blocks=prompt_blocks - w.overlap_blocks + w.pending_prefill_blocks,
                    cost=costs.get(w.instance_id, 0.0),
                    role=w.role,
                )
                for w, costs in [(w, decision.costs) for w in candidates]
                + [(w, prefill_costs) for w in prefill_views]
            ]
            if request.dry_run
            else []
        )
        response = RouteResponse(
            request_id=request.request_id,
            instance_id=chosen.instance_id,
            overlap_blocks=chosen.overlap_blocks,
            prompt_blocks=prompt_blocks,
            policy=self.policy.name,
            workers=workers,
            prefill_instance_id=hop.instance_id if hop is not None else None,
        )
        return Routed(response, decision)

    def _needs_hop(self, chosen: WorkerView, token_ids: list[int]) -> bool:
        """False when the decode worker can prefill this prompt itself and little of it is
        uncached there (the hop would cost more than it saves)."""
        inst = self._instances[chosen.instance_id]
        if not inst.local_prefill:
            return True
        uncached = len(token_ids) - chosen.overlap_blocks * inst.block_size
        return uncached >= self.disagg_min_uncached_tokens

    def _pick_prefill(
        self, views: list[WorkerView], ctx: RouteContext
    ) -> tuple[WorkerView, dict[int, float]]:
        """The prefill worker: the KV policy's cost (overlap + queued prefill) when the policy
        uses overlap, else the fewest in flight. Ties: fewest in flight, then lowest id."""
        cost = getattr(self.policy, "cost", None)
        if self.policy.needs_overlap and callable(cost):
            costs = {w.instance_id: float(cost(w, ctx)) for w in views}
        else:
            costs = {w.instance_id: float(w.in_flight) for w in views}
        best = min(views, key=lambda w: (costs[w.instance_id], w.in_flight, w.instance_id))
        return best, costs

    def _candidates(
        self, instances: list[Instance], token_ids: list[int], now: float
    ) -> tuple[list[WorkerView], int, dict[int, list[int]]]:
        """Worker views, the prompt's block count, and its block hashes per block size."""
        tracker = self.tracker
        overlaps: dict[int, int] = {}
        prompt_blocks = 0
        hashes: dict[int, list[int]] = {}
        if self.policy.needs_overlap:
            # Hash once per block size (normally all workers of a model share one).
            ids = [i.instance_id for i in instances]
            found: dict[int, tuple[dict[int, int], dict[int, int]]] = {}
            for inst in instances:
                size = inst.block_size
                if size not in hashes:
                    hashes[size] = block_hashes(token_ids, size)
                    found[size] = (
                        self.index.overlaps(hashes[size]),
                        self.predicted.overlaps(hashes[size], ids, now),
                    )
            for inst in instances:
                known, expected = found[inst.block_size]
                iid = inst.instance_id
                prompt_blocks = max(prompt_blocks, len(hashes[inst.block_size]))
                overlaps[iid] = max(known.get(iid, 0), expected.get(iid, 0))
        views = [
            WorkerView(
                instance_id=i.instance_id,
                url=i.url,
                model=i.model,
                role=i.role,
                in_flight=tracker.in_flight(i.instance_id),
                in_prefill=tracker.in_prefill(i.instance_id),
                overlap_blocks=overlaps.get(i.instance_id, 0),
                pending_prefill_blocks=tracker.prefill_blocks(i.instance_id),
                active_blocks=tracker.active_blocks(i.instance_id),
            )
            for i in instances
        ]
        return views, prompt_blocks, hashes

    def mark_busy(self, instance_id: int, until: float) -> None:
        self._busy[instance_id] = max(until, self._busy.get(instance_id, 0.0))

    def expire_busy(self, now: float) -> None:
        for instance_id in [i for i, until in self._busy.items() if until <= now]:
            del self._busy[instance_id]

    def progress(self, notice: RouteProgress) -> None:
        if notice.stage == STAGE_FIRST_TOKEN:
            self.tracker.first_token(notice.request_id)
            self.tracker.finish(notice.request_id + PREFILL_BOOKING)
        elif notice.stage == STAGE_FINISHED:
            self.tracker.finish(notice.request_id)
            self.tracker.finish(notice.request_id + PREFILL_BOOKING)
