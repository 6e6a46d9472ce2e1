"""The routing decision: the profile handler runs the decode profile over the model's
workers and, for disaggregated serving, the prefill profile over its prefill workers when its
decider says the request takes the prefill hop (disagg.py); then the load is booked.

Before the profiles run, the core computes what their plugins declared they need: the
prompt's block hashes and every worker's cached prefix (KV index, offloaded tier, pending
bookings) for `Needs.BLOCKS`, the session key for `Needs.SESSION`. Filters that need the
core's state read it from the context (`busy`, `hop_protocols`, `decode_protocol`).

Errors: no worker serves the model at all -> `unknown_model`; every candidate answered
RESOURCE_EXHAUSTED lately (the `not_busy` filter left none) -> `all_busy`; any other filter
left none -> `no_worker`.

Pure and synchronous: the service passes `now`, so tests need no clock.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass

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
from switchyard.router.bookings import Bookings
from switchyard.router.config import RoutingConfig, preset
from switchyard.router.disagg import DEFAULT_MIN_UNCACHED_TOKENS, build_handler
from switchyard.router.framework import Outcome, PluginStats, Profile
from switchyard.router.kv.index import KvIndex
from switchyard.router.load import EngineLoads, InFlightTracker
from switchyard.router.policies import build_profile
from switchyard.router.policies.predicted_ttft import PredictedTtft
from switchyard.router.prefix import cached_tokens
from switchyard.router.prompt_hashes import PromptBlocks, PromptHashes
from switchyard.router.timing import TimeModel
from switchyard.router.types import (
    Needs,
    NoParams,
    PluginDeps,
    ProfileHandler,
    RouteContext,
    Worker,
    WorkerKey,
)

log = logging.getLogger(__name__)

NO_WORKER = "no_worker"
ALL_BUSY = "all_busy"
UNKNOWN_MODEL = "unknown_model"
# Disaggregation: a request whose uncached prompt on the chosen decode worker is shorter than
# this prefills there (no hop). A default, not measured: 256 tokens is where a prefill's
# compute starts to outweigh the hop's cost (a second engine call plus a KV transfer, a few
# ms) on typical GPUs, and it is the order of magnitude llm-d ships for its threshold.
DEFAULT_DISAGG_MIN_UNCACHED_TOKENS = DEFAULT_MIN_UNCACHED_TOKENS
# The prefill hop's load booking lives under the request id with this suffix.
PREFILL_BOOKING = "#prefill"
_EXPIRE_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class Routed:
    """A decision with what the service needs for metrics."""

    response: RouteResponse
    chosen: Worker | None = None


class RouterCore:
    def __init__(
        self,
        config: RoutingConfig | None = None,
        *,
        tracker: InFlightTracker | None = None,
        index: KvIndex | None = None,
        engine_loads: EngineLoads | None = None,
        bookings: Bookings | None = None,
        rng: random.Random | None = None,
        stats: PluginStats | None = None,
        disagg_min_uncached_tokens: int = DEFAULT_DISAGG_MIN_UNCACHED_TOKENS,
    ) -> None:
        if disagg_min_uncached_tokens < 0:
            raise ValueError("--disagg-min-uncached-tokens must be >= 0")
        self.config = config or preset("kv")
        self.tracker = tracker or InFlightTracker()
        self.index = index or KvIndex()
        self.engine_loads = engine_loads or EngineLoads()
        self.bookings = bookings or Bookings(self.config.booking_ttl_s)
        self.prompt_hashes = PromptHashes()
        self.time = TimeModel(self.config.time)
        self.stats = stats or PluginStats()
        deps = PluginDeps(rng or random.Random(), self.time)
        self.decode: Profile = build_profile("decode", self.config.decode, deps, self.stats)
        self.prefill: Profile = build_profile("prefill", self.config.prefill, deps, self.stats)
        self.handler: ProfileHandler = build_handler(
            self.config.disagg, deps, disagg_min_uncached_tokens
        )
        self._ttft = PredictedTtft(NoParams(), deps)  # the flow gate's predictions
        self.needs = self.decode.needs | self.prefill.needs | self.handler.needs
        # As bools: a Flag `&` builds an enum member per test, per decision.
        self._needs_session = bool(self.needs & Needs.SESSION)
        self._needs_blocks = bool(self.needs & Needs.BLOCKS)
        self.mode = self.config.mode
        self._offload_weight = self.config.time.offload_weight
        self._busy: dict[int, float] = {}  # instance id -> busy until (RESOURCE_EXHAUSTED)
        self._instances: Mapping[int, Instance] = {}
        self._decode_workers: dict[str, list[Worker]] = {}  # model -> workers (not prefill)
        self._prefill_workers: dict[str, list[Worker]] = {}  # model -> prefill-role workers
        self._next_expiry = 0.0

    # ---- fleet ---------------------------------------------------------------------------

    def set_instances(self, instances: Mapping[int, Instance]) -> None:
        """Swap in a new instance snapshot (one worker per data-parallel rank); forget the
        load of instances that left."""
        for gone in set(self._instances) - set(instances):
            self.tracker.drop_instance(gone)
            self.engine_loads.drop_instance(gone)
            self.bookings.drop_instance(gone)
        decode: dict[str, list[Worker]] = {}
        prefill: dict[str, list[Worker]] = {}
        for inst in instances.values():
            group = prefill if inst.role == ROLE_PREFILL else decode
            workers = group.setdefault(inst.model, [])
            for rank in range(max(1, inst.dp_size)):
                key = (inst.instance_id, rank)
                workers.append(
                    Worker(inst, rank, self.tracker.load(key), self.engine_loads.load(key))
                )
        self._instances = instances
        self._decode_workers = decode
        self._prefill_workers = prefill

    def workers(self) -> list[Worker]:
        return [
            w
            for ws in (*self._decode_workers.values(), *self._prefill_workers.values())
            for w in ws
        ]

    # ---- decisions -----------------------------------------------------------------------

    def route(self, request: RouteRequest, now: float) -> Routed:
        if now >= self._next_expiry:
            self.tracker.expire(now)
            self._next_expiry = now + _EXPIRE_EVERY_S
        self.tracker.prefilled(now)
        if self._busy:
            self.expire_busy(now)
        model = request.model
        candidates = self._decode_workers.get(model, [])
        prefills = self._prefill_workers.get(model, [])
        ctx = RouteContext(
            request,
            now,
            self.time,
            explain=request.dry_run,
            engine_stale_s=self.engine_loads.stale_after,
            busy=self._busy,
        )
        if prefills:
            ctx.hop_protocols = self._hop_protocols(request, prefills, now)
        if self._needs_session:
            ctx.session = request.session_id
        if self._needs_blocks and (candidates or prefills):
            self._kv_view(ctx, candidates + prefills)
        decision = self.handler.run(ctx, self.decode, self.prefill, candidates, prefills)
        outcome = decision.decode
        chosen = outcome.chosen
        if chosen is None:
            return Routed(self._refusal(request, outcome))
        hop = decision.hop
        if not request.dry_run:
            self._book(ctx, chosen, hop, now)
        explanation = ctx.explanations.get(chosen.key)
        log.debug(
            "route request_id=%s worker=%s mode=%s",
            request.request_id,
            chosen,
            self.mode,
        )
        response = RouteResponse(
            request_id=request.request_id,
            instance_id=chosen.instance_id,
            overlap_blocks=ctx.device_blocks.get(chosen.key, 0),
            prompt_blocks=ctx.prompt_blocks,
            policy=self.mode,
            workers=self._rows(ctx, candidates, outcome, prefills, decision.prefill)
            if request.dry_run
            else [],
            prefill_instance_id=hop.instance_id if hop is not None else None,
            dp_rank=chosen.dp_rank,
            prefill_dp_rank=hop.dp_rank if hop is not None else None,
            predicted_ttft_ms=explanation.ttft_s * 1e3 if explanation is not None else 0.0,
        )
        return Routed(response, chosen)

    def _hop_protocols(
        self, request: RouteRequest, prefills: list[Worker], now: float
    ) -> frozenset[str]:
        exclude = request.exclude
        return frozenset(
            w.instance.protocol
            for w in prefills
            if w.instance.instance_id not in exclude
            and self._busy.get(w.instance.instance_id, 0.0) <= now
        )

    def predict_ttft(self, request: RouteRequest, now: float) -> float:
        """The smallest predicted time to first token (seconds) over the workers the decode
        profile's filters leave for this prompt, by the time model whatever the routing
        mode; 0.0 when none is left (the flow gate then judges by its queue alone)."""
        workers = self._decode_workers.get(request.model, [])
        ctx = RouteContext(
            request,
            now,
            self.time,
            explain=True,
            engine_stale_s=self.engine_loads.stale_after,
            busy=self._busy,
        )
        prefills = self._prefill_workers.get(request.model, [])
        if prefills:
            ctx.hop_protocols = self._hop_protocols(request, prefills, now)
        for plugin in self.decode.filters:
            if not workers:
                return 0.0
            workers = plugin.filter(ctx, workers)
        if not workers:
            return 0.0
        if self._needs_blocks:
            self._kv_view(ctx, workers)
        self._ttft.costs(ctx, workers)
        return min(e.ttft_s for e in ctx.explanations.values())

    def _refusal(self, request: RouteRequest, outcome: Outcome) -> RouteResponse:
        if outcome.emptied_by == "not_busy":
            error = ALL_BUSY
        elif request.model in self._decode_workers or request.model in self._prefill_workers:
            error = NO_WORKER
        else:
            error = NO_WORKER if request.exclude else UNKNOWN_MODEL
        return RouteResponse(
            request_id=request.request_id, instance_id=None, error=error, policy=self.mode
        )

    def _kv_view(self, ctx: RouteContext, workers: list[Worker]) -> None:
        """Hash the prompt once per block size and look every worker up."""
        tokens = ctx.request.token_ids
        sizes = {w.instance.block_size for w in workers}
        index, bookings, now = self.index, self.bookings, ctx.now
        offloaded = index.has_offloaded()
        for size in sorted(sizes):
            # Hashed lazily: the index walk hashes only as deep as some worker holds the
            # prefix, and bookings compare token bytes (see prompt_hashes).
            hashes = self.prompt_hashes.blocks(tokens, size)
            ctx.hashes[size] = hashes
            ctx.prompt_blocks = max(ctx.prompt_blocks, len(hashes))
            found = index.overlaps(hashes)
            booked = (
                self._held_or_booked(
                    found, bookings.overlaps_blocks(hashes.first, hashes.data, hashes.step, now)
                )
                if (bookings and hashes)
                else found
            )
            if offloaded:
                more = index.overlaps_any_tier(hashes)
            if len(sizes) == 1:
                ctx.device_blocks, ctx.pending_blocks = found, booked
                if offloaded:
                    ctx.any_tier_blocks = more
                return
            # Several block sizes: keep each worker's lookups at its own size.
            for w in workers:
                if w.instance.block_size == size:
                    key = w.key
                    if key in found:
                        ctx.device_blocks[key] = found[key]
                    if key in booked:
                        ctx.pending_blocks[key] = booked[key]
                    if offloaded and key in more:
                        ctx.any_tier_blocks[key] = more[key]

    @staticmethod
    def _held_or_booked(
        held: dict[WorkerKey, int], booked: dict[WorkerKey, int]
    ) -> dict[WorkerKey, int]:
        """Per worker, the leading blocks held or booked (bookings start at block 0)."""
        if not booked:
            return held
        merged = dict(held)
        for key, depth in booked.items():
            if depth > merged.get(key, 0):
                merged[key] = depth
        return merged

    def _book(self, ctx: RouteContext, chosen: Worker, hop: Worker | None, now: float) -> None:
        request_id = ctx.request.request_id
        # A whole request (no hop) shows no first token before its end: it times nothing.
        untimed = ctx.request.whole and hop is None
        # With a hop the decode worker receives the prompt's KV: nothing to prefill there.
        self._place(
            ctx, chosen, request_id, now, prefills=hop is None,
            learn=hop is None and chosen.instance.local_prefill and not untimed, untimed=untimed,
        )  # fmt: skip
        if hop is not None:  # freed at the request's first token (the prefill is done by then)
            self._place(ctx, hop, request_id + PREFILL_BOOKING, now, prefills=True, learn=True)
        self.decode.observe(ctx, chosen)
        if hop is not None:
            self.prefill.observe(ctx, hop)

    def _place(
        self, ctx: RouteContext, w: Worker, booking_id: str, now: float, *, prefills: bool,
        learn: bool, untimed: bool = False,
    ) -> None:  # fmt: skip
        """Book the prompt's blocks and its load on one worker (`prefills`: it computes the
        uncached part itself; `untimed`: no first token will say when that is done, so the
        worker's fitted prefill speed predicts it)."""
        prompt = ctx.prompt_tokens
        uncached = prompt
        if ctx.hashes:
            self._book_blocks(ctx, w, now)
            uncached -= int(cached_tokens(ctx, w, self._offload_weight)[0])
        prefill = uncached if prefills else 0
        prefilled_at = None
        if untimed:
            speed = self.time.speed(w.key, now)
            ahead = self.tracker.load(w.key).prefill_tokens
            prefilled_at = now + speed.base + speed.slope * (ahead + prefill)
        self.tracker.add(
            booking_id, w.key, now, prefill_tokens=prefill, tokens=prompt,
            kv_tokens=uncached, learn=learn, prefilled_at=prefilled_at,
        )  # fmt: skip

    def _book_blocks(self, ctx: RouteContext, w: Worker, now: float) -> None:
        """Book the prompt's blocks on a worker: its token bytes when the core hashed it
        (no hash beyond the first needed), else the hashes a plugin left."""
        hashes = ctx.hashes.get(w.instance.block_size)
        if not hashes:
            return
        if isinstance(hashes, PromptBlocks):
            self.bookings.add_blocks(w.key, hashes.first, hashes.data, hashes.step, now)
        else:
            self.bookings.add(w.key, hashes, now)

    def _rows(
        self,
        ctx: RouteContext,
        candidates: list[Worker],
        outcome: Outcome,
        prefills: list[Worker],
        prefill_outcome: Outcome | None,
    ) -> list[WorkerScore]:
        rows = self._profile_rows(ctx, candidates, outcome, "decode")
        if prefill_outcome is not None:
            rows += self._profile_rows(ctx, prefills, prefill_outcome, "prefill")
        return rows

    def _profile_rows(
        self, ctx: RouteContext, workers: list[Worker], outcome: Outcome, profile: str
    ) -> list[WorkerScore]:
        position = {id(w): i for i, w in enumerate(outcome.workers)}
        rows = []
        for w in workers:
            i = position.get(id(w))
            scores = (
                {name: values[i] for name, values in outcome.scores.items()}
                if (i is not None)
                else {}
            )
            total = outcome.totals[i] if i is not None else 0.0
            why = ctx.explanations.get(w.key)
            report = ctx.engine_report(w)
            size = w.instance.block_size
            overlap = ctx.device_blocks.get(w.key, 0)
            rows.append(
                WorkerScore(
                    instance_id=w.instance_id,
                    url=w.instance.url,
                    overlap_blocks=overlap,
                    in_flight=w.load.in_flight,
                    active_blocks=w.load.active_tokens // size,
                    prefill_blocks=max(ctx.prompt_blocks - overlap, 0)
                    + w.load.prefill_tokens // size,
                    cost=-total if i is not None else float("inf"),
                    role=w.instance.role,
                    dp_rank=w.dp_rank,
                    profile=profile,
                    score=total,
                    scores=scores,
                    filtered_by=outcome.filtered.get(w.key, "") if i is None else "",
                    ttft_ms=why.ttft_s * 1e3 if why else 0.0,
                    prefill_ms=why.prefill_s * 1e3 if why else 0.0,
                    queue_ms=why.queue_s * 1e3 if why else 0.0,
                    decode_ms=why.decode_s * 1e3 if why else 0.0,
                    cached_tokens=why.cached_tokens if why else overlap * size,
                    pending_tokens=why.pending_tokens if why else 0,
                    engine_running=report.running if report else -1,
                    engine_waiting=report.waiting if report else -1,
                    engine_kv_usage=report.kv_usage if report else -1.0,
                )
            )
        return rows

    # ---- notices -------------------------------------------------------------------------

    def mark_busy(self, instance_id: int, until: float) -> None:
        self._busy[instance_id] = max(until, self._busy.get(instance_id, 0.0))

    def expire_busy(self, now: float) -> None:
        for instance_id in [i for i, until in self._busy.items() if until <= now]:
            del self._busy[instance_id]

    def progress(self, notice: RouteProgress, now: float | None = None) -> None:
        tracker = self.tracker
        if notice.stage == STAGE_FIRST_TOKEN:
            first = tracker.first_token(notice.request_id, now)
            hop = tracker.first_token(notice.request_id + PREFILL_BOOKING, now)
            tracker.finish(notice.request_id + PREFILL_BOOKING)
            for seen in (first, hop):
                if seen is not None:
                    self.time.observe(seen.key, seen.tokens, seen.seconds, now)
        elif notice.stage == STAGE_FINISHED:
            tracker.finish(notice.request_id)
            tracker.finish(notice.request_id + PREFILL_BOOKING)
