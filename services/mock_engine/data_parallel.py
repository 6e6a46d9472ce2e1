"""The engine's data-parallel ranks: one MockEngine per rank, each with its own prefix cache,
scheduler and KV-event publisher, as each DP rank of SGLang and vLLM is its own engine core.

A request pinned with `data_parallel_rank` runs on that rank (one out of range is refused,
INVALID_ARGUMENT); an unpinned one runs on the rank with the fewest running requests, ties
to the lowest rank (vLLM's DP coordinator balances by load; SGLang's controller by round
robin or by load, per its --load-balance-method). Everything else spans the ranks: abort finds
the request wherever it runs, flushing needs every rank idle, the loads are per rank and
summed. With one rank this is the MockEngine itself, plus routing.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

from switchyard.mock_engine.distribution import Distribution
from switchyard.mock_engine.errors import RequestRejected
from switchyard.mock_engine.generation import MockEngine
from switchyard.mock_engine.kv_cache import Lease, PrefixCache
from switchyard.mock_engine.timing import Timing
from switchyard.mock_engine.types import GenerationRequest, LoadSnapshot, Step


class DataParallelEngine:
    def __init__(self, ranks: Sequence[MockEngine]) -> None:
        if not ranks:
            raise ValueError("at least one data-parallel rank")
        self.ranks = list(ranks)
        self._holds: dict[int, MockEngine] = {}  # id(lease) -> the rank holding it

    # -- what one rank answers for all ---------------------------------------------------

    @property
    def dp_size(self) -> int:
        return len(self.ranks)

    @property
    def cache(self) -> PrefixCache:
        """Rank 0's cache (the only one without DP)."""
        return self.ranks[0].cache

    @property
    def timing(self) -> Timing:
        return self.ranks[0].timing

    @property
    def distribution(self) -> Distribution:
        """The next-token distribution (the same on every rank: one model)."""
        return self.ranks[0].distribution

    @property
    def max_prompt_tokens(self) -> int:
        return self.ranks[0].max_prompt_tokens

    @property
    def kv_pool_tokens(self) -> int:
        """One rank's KV pool (SGLang and vLLM report per-scheduler figures)."""
        return self.ranks[0].kv_pool_tokens

    @property
    def active_requests(self) -> int:
        return sum(rank.active_requests for rank in self.ranks)

    @property
    def hung_requests(self) -> int:
        return sum(rank.hung_requests for rank in self.ranks)

    @property
    def aborts(self) -> int:
        return sum(rank.aborts for rank in self.ranks)

    @property
    def tokens_generated(self) -> int:
        return sum(rank.tokens_generated for rank in self.ranks)

    @property
    def total_requests(self) -> int:
        return sum(rank.total_requests for rank in self.ranks)

    def new_request_id(self) -> str:
        return self.ranks[0].new_request_id()

    # -- requests ---------------------------------------------------------------------------

    def rank_for(self, request: GenerationRequest) -> MockEngine:
        rank = request.dp_rank
        if rank is None:
            return min(self.ranks, key=lambda r: r.active_requests)
        if not 0 <= rank < len(self.ranks):
            raise RequestRejected(
                request.request_id,
                f"data_parallel_rank {rank} is out of range [0, {len(self.ranks)})",
            )
        return self.ranks[rank]

    def validate(self, request: GenerationRequest) -> None:
        self.rank_for(request).validate(request)

    def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        """Raises RequestRejected (a bad request or rank) when iterated, as MockEngine does."""
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        engine = self.rank_for(request)
        # aclosing: a consumer that stops early must end the rank's generation now (its
        # blocks unpinned), not whenever the inner generator is collected.
        async with aclosing(engine.generate(request)) as steps:
            async for step in steps:
                yield step

    def abort(self, request_id: str) -> bool:
        """Every rank is asked: the samples of an n > 1 request may run on several."""
        found = [rank.abort(request_id) for rank in self.ranks]
        return any(found)

    def flush_cache(self) -> bool:
        if self.active_requests:
            return False
        return all(rank.flush_cache() for rank in self.ranks)

    def first_token_delay_s(self, prompt_ids: Sequence[int]) -> float:
        return min(rank.first_token_delay_s(prompt_ids) for rank in self.ranks)

    # -- KV kept for a handover -------------------------------------------------------------

    def hold(self, prompt_ids: Sequence[int]) -> Lease:
        """Pin the prompt's blocks on the rank that caches most of it (the one that just
        prefilled it)."""
        best = max(self.ranks, key=lambda r: r.cache.match_tokens(prompt_ids))
        lease = best.hold(prompt_ids)
        self._holds[id(lease)] = best
        return lease

    def unhold(self, lease: Lease) -> None:
        rank = self._holds.pop(id(lease), self.ranks[0])
        rank.unhold(lease)

    # -- loads ------------------------------------------------------------------------------

    def rank_loads(self) -> list[LoadSnapshot]:
        return [rank.loads() for rank in self.ranks]

    def loads(self) -> LoadSnapshot:
        """Summed over the ranks (the last receive time is the latest)."""
        snaps = self.rank_loads()
        if len(snaps) == 1:
            return snaps[0]
        prompt_hits = [(r.cache.hit_rate, r.total_requests) for r in self.ranks]
        weight = sum(n for _, n in prompt_hits)
        return LoadSnapshot(
            running_requests=sum(s.running_requests for s in snaps),
            used_tokens=sum(s.used_tokens for s in snaps),
            capacity_tokens=sum(s.capacity_tokens for s in snaps),
            gen_throughput=sum(s.gen_throughput for s in snaps),
            last_receive_time=max(s.last_receive_time for s in snaps),
            cached_tokens=sum(s.cached_tokens for s in snaps),
            cache_hit_rate=sum(h * n for h, n in prompt_hits) / weight if weight else 0.0,
        )
