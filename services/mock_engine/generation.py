"""The protocol-neutral core: validates requests and runs each one's generation loop.

`MockEngine.generate` is an async generator of `Step`s, one token per step. A request first
matches its prompt against the prefix cache (`kv_cache`), waits its simulated prefill (by
uncached tokens, see `timing`) plus --ttft-ms, stores its prompt's full blocks, then decodes
one token per step, each step slower the more requests are running. Decode steps are the
batch's, not each request's: one timer releases the next token of every running request that
waits for it, as a continuous-batching engine's forward step does (SGLang's servicer hands a
step's BatchTokenIDOutput to every request's stream in one go), so a client sees the tokens of
one step arrive together. Output blocks are stored
as they fill (vLLM policy) or when the request ends (SGLang policy); cache events go to the
event sink. Pauses wake early on `abort`, so an aborted request ends at once with a
`FinishReason.ABORT` step; a consumer that stops iterating (its gRPC call was cancelled) ends
the generation where it stands. Either way its blocks are unpinned.

Disaggregation: a request whose prompt KV a prefill engine handed over (`transferred_tokens`)
pays no prefill: its first token comes after one decode step, and its cached_tokens is the
transferred count (or the local prefix hit, if larger); its prompt blocks are stored as usual.
`hold` pins a prompt's cached blocks past the end of its request (KV kept for a handover).

Faults (`faults`): a request may go silent after N tokens (never finishing, deaf to Abort,
ended only by its caller's cancellation), and the process may crash after N tokens in total.

Limits: a prompt must be shorter than the context length; generation stops with "length"
when prompt + output reaches the context length or max new tokens is reached (the length
check runs before the EOS/stop checks, as in SGLang and vLLM). EOS and stop tokens are
never drawn before min new tokens is reached; with ignore_eos, EOS is never drawn. Emitted
EOS and stop tokens are part of the output token ids.

Sampling extras (`distribution`): logit_bias changes the drawn token (argmax of the biased
logits); a request that asks for logprobs gets each step's `score`. A request with an output
plan (constrained or scripted output) emits the plan's tokens, then EOS (finish "stop", also
under ignore_eos or before min tokens: the output is complete); the length limit and stop ids
and strings still apply to them. The plan's seed is the prompt's state mixed with the
sample's salt, so samples with different seeds get different (valid) outputs.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import random
import time
from collections.abc import AsyncGenerator, Callable, Sequence

from switchyard.mock_engine.distribution import Distribution
from switchyard.mock_engine.errors import PromptTooLong, RequestRejected
from switchyard.mock_engine.faults import FaultInjector
from switchyard.mock_engine.kv_cache import Lease, PrefixCache
from switchyard.mock_engine.timing import Timing
from switchyard.mock_engine.tokens import TokenOracle, absorb, absorb_all, mix64, salt_for_seed
from switchyard.mock_engine.types import (
    EventSink,
    Finish,
    FinishReason,
    GenerationRequest,
    KvEvent,
    LoadSnapshot,
    SamplingSpec,
    Step,
)

logger = logging.getLogger(__name__)

_THROUGHPUT_WINDOW_S = 5


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _new_match(stop_strings: tuple[str, ...], text: str, old_chars: int) -> str | None:
    """The first stop string that ends inside `text[old_chars:]` (the newest token's text)."""
    for stop in stop_strings:
        if text.find(stop, max(0, old_chars - len(stop) + 1)) != -1:
            return stop
    return None


class _Running:
    """A request in flight: its progress and an abortable pause."""

    __slots__ = (
        "request_id",
        "group",
        "prompt_tokens",
        "lease",
        "generated",
        "aborted",
        "hung",
        "_wake",
    )

    def __init__(self, request_id: str, prompt_tokens: int, lease: Lease, group: str = "") -> None:
        self.request_id = request_id
        self.group = group
        self.prompt_tokens = prompt_tokens
        self.lease = lease
        self.generated = 0
        self.aborted = False
        self.hung = False
        self._wake: asyncio.Future[None] | None = None

    async def pause(self, delay_s: float) -> None:
        if self.aborted:
            return
        if delay_s <= 0:
            await asyncio.sleep(0)  # still let the other requests run
            return
        loop = asyncio.get_running_loop()
        wake: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(delay_s, _settle, wake)
        try:
            await self.until(wake)
        finally:
            timer.cancel()

    async def until(self, wake: asyncio.Future[None]) -> None:
        """Wait for `wake` (settled by someone else); an abort ends the wait early."""
        self._wake = wake
        try:
            await wake
        finally:
            self._wake = None

    def abort(self) -> None:
        self.aborted = True
        if self._wake is not None:
            _settle(self._wake)

    async def hang(self) -> None:
        """Never return (an injected hang): only cancelling the caller ends it."""
        self.hung = True
        await asyncio.get_running_loop().create_future()


class _ThroughputMeter:
    """Generated tokens per second over the last few whole seconds."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._buckets: collections.Counter[int] = collections.Counter()

    def add(self, count: int = 1) -> None:
        self._buckets[int(self._clock())] += count

    def rate(self) -> float:
        now = int(self._clock())
        oldest = now - _THROUGHPUT_WINDOW_S
        for second in [s for s in self._buckets if s < oldest]:
            del self._buckets[second]
        total = sum(count for second, count in self._buckets.items() if second < now)
        return total / _THROUGHPUT_WINDOW_S


class MockEngine:
    """Runs generation requests; shared by both protocol adapters."""

    def __init__(
        self,
        *,
        oracle: TokenOracle,
        vocab_size: int,
        context_length: int,
        cache: PrefixCache,
        timing: Timing,
        token_text: Callable[[int], str],
        events: EventSink | None = None,
        faults: FaultInjector | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.oracle = oracle
        self.distribution = Distribution(oracle, vocab_size)
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.cache = cache
        self.timing = timing
        self._events = events
        self._faults = faults
        self._token_text = token_text
        self._wall_clock = wall_clock
        self._rng = rng if rng is not None else random.Random()
        self._active: dict[str, _Running] = {}
        self._clock = clock  # monotonic, as the event loop's timers
        self._meter = _ThroughputMeter(clock)
        self._last_receive_time = 0.0
        self.total_requests = 0
        self.tokens_generated = 0  # over every request since start
        # Requests that ended unfinished because their caller aborted them: an Abort call,
        # or a cancelled Generate call (the stock servicers abort the request then too).
        self.aborts = 0
        # With timing.prefill_stalls_decode: one prefill at a time, in arrival order, and the
        # loop time the running one ends (decode steps due before then wait for it).
        self._prefill_slot = asyncio.Lock()
        self._prefill_busy_until = 0.0
        # The batch's next decode step: its timer, and the wake-ups of the requests in it.
        self._step_timer: asyncio.TimerHandle | None = None
        self._stepping: list[asyncio.Future[None]] = []
        # Events held back until the next request's step (reset_prefix_cache's clear).
        self._deferred: list[KvEvent] = []

    @property
    def max_prompt_tokens(self) -> int:
        return self.context_length - 1

    @property
    def active_requests(self) -> int:
        return len(self._active)

    @property
    def hung_requests(self) -> int:
        """Running requests silenced by --hang-after-tokens."""
        return sum(1 for running in self._active.values() if running.hung)

    @property
    def kv_pool_tokens(self) -> int:
        return self.cache.capacity_tokens

    def new_request_id(self) -> str:
        return f"mock-{self._rng.getrandbits(64):016x}"

    def loads(self) -> LoadSnapshot:
        """Used = pinned cached blocks (shared ones once) + each request's tokens outside them."""
        size = self.cache.block_size
        loose = sum(
            max(0, r.prompt_tokens + r.generated - r.lease.held * size)
            for r in self._active.values()
        )
        return LoadSnapshot(
            running_requests=len(self._active),
            used_tokens=self.cache.pinned_blocks * size + loose,
            capacity_tokens=self.kv_pool_tokens,
            gen_throughput=self._meter.rate(),
            last_receive_time=self._last_receive_time,
            cached_tokens=self.cache.cached_blocks * size,
            cache_hit_rate=self.cache.hit_rate,
        )

    def first_token_delay_s(self, prompt_ids: Sequence[int]) -> float:
        """What a request for `prompt_ids` would wait now before its first token."""
        return self.timing.first_token_s(len(prompt_ids) - self.cache.match_tokens(prompt_ids))

    def flush_cache(self) -> bool:
        """Drop the whole prefix cache (AllBlocksCleared); False while requests are running."""
        if self._active:
            return False
        events = self.cache.clear()
        if events is None:  # pragma: no cover - nothing is pinned without running requests
            return False
        self._emit(events)
        logger.info("prefix cache flushed")
        return True

    def reset_prefix_cache(self) -> bool:
        """Drop the whole prefix cache now, its AllBlocksCleared published only at the next
        request's step, as vLLM's reset_prefix_cache (the scheduler publishes the events it
        queued when it next schedules); False while requests are running."""
        if self._active:
            return False
        events = self.cache.clear()
        if events is None:  # pragma: no cover - nothing is pinned without running requests
            return False
        self._deferred.extend(events)
        return True

    async def warm_up(self, prompts: Sequence[Sequence[int]]) -> None:
        """The vLLM servicer's warm-up requests: the prompts at once, greedy, one token each;
        their blocks are stored and published as any request's."""

        async def one(i: int, prompt: Sequence[int]) -> None:
            request = GenerationRequest(
                f"warm-up-{i}", tuple(prompt), SamplingSpec(max_new_tokens=1, ignore_eos=True)
            )
            async for _ in self.generate(request):
                pass

        async with asyncio.TaskGroup() as group:
            for i, prompt in enumerate(prompts):
                group.create_task(one(i, prompt))

    def _emit(self, events: list[KvEvent]) -> None:
        if self._deferred:
            events = [*self._deferred, *events]
            self._deferred.clear()
        if events and self._events is not None:
            self._events.emit(events)

    def _commit(self, lease: Lease, tokens: Sequence[int], computed: int) -> None:
        self._emit(self.cache.commit(lease, tokens, computed))

    def hold(self, prompt_ids: Sequence[int]) -> Lease:
        """Pin the prompt's cached full blocks until `unhold` (KV kept for a handover)."""
        return self.cache.hold(prompt_ids)

    def unhold(self, lease: Lease) -> None:
        self.cache.release(lease)

    def abort(self, request_id: str) -> bool:
        """Abort a running request (or every sample of an n > 1 request by its caller's id);
        False when no such request is running."""
        running = self._active.get(request_id)
        targets = [running] if running is not None else []
        targets += [r for r in self._active.values() if r.group == request_id and r is not running]
        for target in targets:
            target.abort()
            logger.info("aborted request_id=%s", target.request_id)
        return bool(targets)

    def validate(self, request: GenerationRequest) -> None:
        """Raise RequestRejected for what the real engines refuse with INVALID_ARGUMENT."""
        rid = request.request_id
        prompt = request.prompt_ids
        sampling = request.sampling
        if not prompt:
            raise RequestRejected(rid, "The decoder prompt cannot be empty")
        if len(prompt) > self.max_prompt_tokens:
            raise PromptTooLong(
                rid,
                f"The input ({len(prompt)} tokens) is longer than the model's context length "
                f"({self.context_length} tokens) allows: at most {self.max_prompt_tokens} "
                "prompt tokens.",
                len(prompt),
                self.context_length,
            )
        highest = max(prompt)
        if highest >= self.vocab_size or min(prompt) < 0:
            raise RequestRejected(rid, f"Token id {highest} is out of vocabulary")
        if not sampling.temperature >= 0 or math.isinf(sampling.temperature):
            raise RequestRejected(
                rid, f"temperature must be non-negative, got {sampling.temperature}"
            )
        if sampling.min_new_tokens < 0:
            raise RequestRejected(rid, f"min tokens must be >= 0, got {sampling.min_new_tokens}")
        if sampling.max_new_tokens is not None:
            if sampling.max_new_tokens < 0:
                raise RequestRejected(
                    rid, f"max tokens must be >= 0, got {sampling.max_new_tokens}"
                )
            if sampling.min_new_tokens > sampling.max_new_tokens:
                raise RequestRejected(
                    rid,
                    f"min tokens ({sampling.min_new_tokens}) must be less than or equal to "
                    f"max tokens ({sampling.max_new_tokens})",
                )
        if rid in self._active:
            raise RequestRejected(rid, f"Request id {rid} already running.")
        if not 0 <= request.transferred_tokens <= len(prompt):
            raise RequestRejected(
                rid, f"transferred tokens ({request.transferred_tokens}) exceed the prompt"
            )
        if sampling.logit_bias:
            outside = sorted(t for t in sampling.logit_bias if not 0 <= t < self.vocab_size)
            if outside:
                raise RequestRejected(
                    rid,
                    f"token_id(s) {outside} in logit_bias contain out-of-vocab token ids. "
                    f"Vocabulary size: {self.vocab_size}",
                    "logit_bias",
                    outside,
                )
        if sampling.logprobs is not None and sampling.logprobs < 0:
            raise RequestRejected(rid, f"logprobs must be >= 0, got {sampling.logprobs}")

    async def _prefill_in_turn(self, running: _Running, prompt: Sequence[int]) -> Lease:
        """With prefill_stalls_decode: wait for the prefills ahead, then match the prompt
        against the cache (as the engines' schedulers do when they take a request from the
        waiting queue, so a burst sharing a new prefix hits what the first one stored), run
        the prefill and store the prompt's blocks. The lease is the running request's."""
        async with self._prefill_slot:
            lease = running.lease = self.cache.begin(prompt)
            prefill = self.timing.prefill_s(len(prompt) - lease.cached_tokens)
            self._prefill_busy_until = self._clock() + prefill
            await running.pause(prefill)
            if not running.aborted:
                self._commit(lease, prompt, len(prompt))
            return lease

    def _decode_delay(self) -> float:
        """The next decode step, after the prefill that holds the GPU (if stalls are on)."""
        step = self.timing.decode_step_s(len(self._active))
        if self.timing.prefill_stalls_decode:
            step += max(0.0, self._prefill_busy_until - self._clock())
        return step

    async def _next_step(self, running: _Running) -> None:
        """Until the batch's next decode step: the first request to wait starts its timer (the
        step's length from the batch size then), the others join that step."""
        if running.aborted:
            return
        loop = asyncio.get_running_loop()
        if self._step_timer is None:
            delay = self._decode_delay()
            if delay <= 0:
                await asyncio.sleep(0)  # still let the other requests run
                return
            self._step_timer = loop.call_later(delay, self._step)
        wake: asyncio.Future[None] = loop.create_future()
        self._stepping.append(wake)
        await running.until(wake)

    def _step(self) -> None:
        self._step_timer = None
        stepping, self._stepping = self._stepping, []
        for wake in stepping:
            _settle(wake)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Step, None]:
        """Validate and run one request (raises RequestRejected before the first step)."""
        self.validate(request)
        rid = request.request_id
        sampling = request.sampling
        prompt = request.prompt_ids
        # A queued prefill matches the cache when its turn comes (an empty lease until then).
        queued = self.timing.prefill_stalls_decode and not request.transferred_tokens
        lease = Lease([], 0, 0) if queued else self.cache.begin(prompt)
        cached = max(lease.cached_tokens, request.transferred_tokens)
        running = _Running(rid, len(prompt), lease, request.group)
        self._active[rid] = running
        if self._deferred:  # this request's step publishes what the last reset queued
            self._emit([])
        self._last_receive_time = self._wall_clock()
        self.total_requests += 1
        each_step = self.cache.policy.store_output_each_step
        faults = self._faults
        tokens = list(prompt)  # prompt + output: what the cache stores blocks of
        prefilled = False
        finished = False  # the request's last step was (or is being) handed out
        try:
            room = self.context_length - len(prompt)
            limit = room if sampling.max_new_tokens is None else min(room, sampling.max_new_tokens)
            if sampling.temperature > 0:
                seed = sampling.seed if sampling.seed is not None else self._rng.getrandbits(64)
                salt = salt_for_seed(seed)
            else:
                salt = 0
            state = absorb_all(prompt)
            forced = tuple(request.output.tokens(mix64(state ^ salt))) if request.output else None
            bias = sampling.logit_bias
            top = sampling.logprobs
            dist = self.distribution
            stop_ids = sampling.stop_token_ids
            stop_strings = tuple(s for s in sampling.stop_strings if s)
            keep = max((len(s) for s in stop_strings), default=1) - 1
            tail = ""
            eos = self.oracle.eos_token_id
            produced = 0
            if request.transferred_tokens:  # the KV arrived: straight to decoding
                first_delay = self._decode_delay()
            elif queued:
                lease = await self._prefill_in_turn(running, prompt)
                cached = lease.cached_tokens
                first_delay = self.timing.ttft_s
            else:
                first_delay = self.timing.first_token_s(len(prompt) - cached)
            await running.pause(first_delay)
            if not running.aborted:
                prefilled = True
                if not queued:  # a queued prefill stored the prompt as it ended
                    self._commit(lease, tokens, len(prompt))
            if limit == 0 and not running.aborted:
                finished = True
                yield Step((), 0, Finish(FinishReason.LENGTH), cached)
                return
            while True:
                if running.aborted:
                    yield Step((), produced, Finish(FinishReason.ABORT), cached)
                    return
                if faults is not None and faults.hangs_at(produced):
                    logger.info("request_id=%s hangs after %d tokens (injected)", rid, produced)
                    await running.hang()
                may_stop = produced >= sampling.min_new_tokens
                allow_eos = may_stop and not sampling.ignore_eos
                banned = () if may_stop else stop_ids
                dictated = forced is not None
                if forced is not None:
                    token = forced[produced] if produced < len(forced) else eos
                elif bias:
                    token = dist.choose(
                        state, salt=salt, allow_eos=allow_eos, banned=banned, bias=bias
                    )
                else:
                    token = self.oracle.pick(state, salt=salt, allow_eos=allow_eos, banned=banned)
                score = None
                if top is not None:
                    if dictated or not bias:
                        score = dist.score(state, token, top=top, banned=banned)
                    else:
                        first = self.oracle.pick(
                            state, salt=salt, allow_eos=allow_eos, banned=banned
                        )
                        score = dist.score(
                            state,
                            token,
                            top=top,
                            first=first,
                            bias=bias,
                            banned=banned,
                            allow_eos=allow_eos,
                        )
                state = absorb(state, token)
                produced += 1
                running.generated = produced
                tokens.append(token)
                if each_step:  # the newest token's KV is computed by the next step
                    self._commit(lease, tokens, len(tokens) - 1)
                self._meter.add()
                self.tokens_generated += 1
                finish: Finish | None = None
                if produced >= limit:
                    finish = Finish(FinishReason.LENGTH)
                elif token == eos and (dictated or not sampling.ignore_eos):
                    finish = Finish(FinishReason.STOP, matched_token_id=token, matched_is_eos=True)
                elif token in stop_ids and may_stop:
                    finish = Finish(FinishReason.STOP, matched_token_id=token)
                elif stop_strings:
                    text = tail + self._token_text(token)
                    matched = _new_match(stop_strings, text, len(tail)) if may_stop else None
                    if matched is not None:
                        finish = Finish(FinishReason.STOP, matched_stop_str=matched)
                    tail = text[-keep:] if keep else ""
                finished = finish is not None
                yield Step((token,), produced, finish, cached, score)
                if faults is not None:
                    faults.after_token(self.tokens_generated)
                if finish is not None:
                    return
                await self._next_step(running)
        finally:
            del self._active[rid]
            if not finished:
                self.aborts += 1
            lease = running.lease  # a queued prefill cancelled in its turn has one too
            if prefilled and not each_step:  # SGLang caches a finished request's sequence
                self._commit(lease, tokens, max(len(prompt), len(tokens) - 1))
            self.cache.release(lease)
