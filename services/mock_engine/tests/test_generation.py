"""The protocol-neutral core: limits, stops, min tokens, abort, cancellation, validation."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Sequence
from contextlib import aclosing
from typing import Any

import pytest

from switchyard.mock_engine.config import default_tokenizer_dir
from switchyard.mock_engine.errors import RequestRejected
from switchyard.mock_engine.generation import MockEngine
from switchyard.mock_engine.kv_cache import (
    SGLANG_POLICY,
    VLLM_POLICY,
    CachePolicy,
    EngineHasher,
    PrefixCache,
)
from switchyard.mock_engine.timing import Timing
from switchyard.mock_engine.tokenizer_facts import TokenizerFacts, load_tokenizer_facts
from switchyard.mock_engine.tokens import TokenOracle
from switchyard.mock_engine.types import (
    AllBlocksCleared,
    BlockStored,
    Finish,
    FinishReason,
    GenerationRequest,
    KvEvent,
    SamplingSpec,
    Step,
)

PROMPT = (100, 200, 300, 400)


@pytest.fixture(scope="module")
def facts() -> TokenizerFacts:
    return load_tokenizer_facts(default_tokenizer_dir())


class Recorder:
    """An event sink that keeps every emitted event in order."""

    def __init__(self) -> None:
        self.events: list[KvEvent] = []

    def emit(self, events: Sequence[KvEvent]) -> None:
        self.events.extend(events)

    def stored(self) -> list[BlockStored]:
        return [e for e in self.events if isinstance(e, BlockStored)]


def make_engine(
    facts: TokenizerFacts,
    *,
    context_length: int = 256,
    itl_s: float = 0.0,
    policy: CachePolicy = SGLANG_POLICY,
    sink: Recorder | None = None,
) -> MockEngine:
    return MockEngine(
        oracle=TokenOracle(facts.ordinary_ids, facts.eos_token_id),
        vocab_size=facts.vocab_size,
        context_length=context_length,
        cache=PrefixCache(block_size=16, num_blocks=64, hasher=EngineHasher(7), policy=policy),
        timing=Timing(itl_s=itl_s),
        token_text=facts.text_of,
        events=sink,
        rng=random.Random(7),
    )


async def steps_of(
    engine: MockEngine, prompt: Iterable[int] = PROMPT, rid: str = "r", **sampling: Any
) -> list[Step]:
    request = GenerationRequest(rid, tuple(prompt), SamplingSpec(**sampling))
    async with aclosing(engine.generate(request)) as steps:
        return [step async for step in steps]


def tokens(steps: list[Step]) -> list[int]:
    return [t for step in steps for t in step.token_ids]


def finish_of(steps: list[Step]) -> Finish:
    finish = steps[-1].finish
    assert finish is not None
    return finish


class TestLimits:
    async def test_max_new_tokens_gives_length(self, facts: TokenizerFacts) -> None:
        steps = await steps_of(make_engine(facts), max_new_tokens=7, ignore_eos=True)
        assert len(tokens(steps)) == 7
        assert [s.completion_tokens for s in steps] == list(range(1, 8))
        assert steps[-1].finish is not None and steps[-1].finish.reason is FinishReason.LENGTH
        assert all(s.finish is None for s in steps[:-1])

    async def test_context_limit_gives_length(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts, context_length=20)
        steps = await steps_of(engine, prompt=range(100, 115), ignore_eos=True)
        assert len(tokens(steps)) == 5
        assert finish_of(steps).reason is FinishReason.LENGTH

    async def test_until_eos_without_max(self, facts: TokenizerFacts) -> None:
        steps = await steps_of(make_engine(facts, context_length=4096))
        out = tokens(steps)
        assert out[-1] == facts.eos_token_id and facts.eos_token_id not in out[:-1]
        finish = finish_of(steps)
        assert finish.reason is FinishReason.STOP and finish.matched_is_eos
        assert set(out[:-1]) <= set(facts.ordinary_ids)

    async def test_zero_max_new_tokens_finishes_at_once(self, facts: TokenizerFacts) -> None:
        steps = await steps_of(make_engine(facts), max_new_tokens=0)
        assert steps == [Step((), 0, Finish(FinishReason.LENGTH))]


class TestStops:
    async def test_stop_token_id(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts)
        free = tokens(await steps_of(engine, max_new_tokens=30, ignore_eos=True))
        index = next(i for i in range(3, 30) if free[i] not in free[:i])
        steps = await steps_of(engine, max_new_tokens=30, stop_token_ids=frozenset({free[index]}))
        assert tokens(steps) == free[: index + 1]
        finish = finish_of(steps)
        assert finish.reason is FinishReason.STOP and finish.matched_token_id == free[index]
        assert not finish.matched_is_eos

    async def test_min_tokens_hold_back_eos_and_stop_ids(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts, context_length=4096)
        free = tokens(await steps_of(engine))
        first_stop = len(free) - 1  # index of the EOS
        minimum = first_stop + 3
        stop_ids = frozenset(free[:first_stop])
        out = tokens(await steps_of(engine, min_new_tokens=minimum, stop_token_ids=stop_ids))
        assert len(out) > minimum
        assert facts.eos_token_id not in out[:minimum]
        assert not stop_ids & set(out[:minimum])

    async def test_ignore_eos_never_emits_eos(self, facts: TokenizerFacts) -> None:
        out = tokens(await steps_of(make_engine(facts), max_new_tokens=200, ignore_eos=True))
        assert len(out) == 200 and facts.eos_token_id not in out

    async def test_stop_string(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts)
        free = tokens(await steps_of(engine, max_new_tokens=20, ignore_eos=True))
        text = facts.text_of(free[9]).strip() or facts.text_of(free[9])
        index = next(
            i for i in range(len(free)) if text in "".join(map(facts.text_of, free[: i + 1]))
        )
        steps = await steps_of(engine, max_new_tokens=20, ignore_eos=True, stop_strings=(text,))
        assert tokens(steps) == free[: index + 1]
        assert finish_of(steps).matched_stop_str == text


class TestAbortAndCancel:
    async def test_abort_ends_with_an_abort_step(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts, context_length=100_000, itl_s=0.05)
        request = GenerationRequest("slow", PROMPT, SamplingSpec(ignore_eos=True))
        seen: list[Step] = []
        async with aclosing(engine.generate(request)) as steps:
            async for step in steps:
                seen.append(step)
                if len(seen) == 2:
                    assert engine.abort("slow")
        assert seen[-1].finish is not None and seen[-1].finish.reason is FinishReason.ABORT
        assert seen[-1].token_ids == () and seen[-1].completion_tokens == 2
        assert engine.active_requests == 0
        assert not engine.abort("slow")

    async def test_cancelled_consumer_stops_generation(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts, context_length=100_000, itl_s=0.05)
        first = asyncio.Event()

        async def consume() -> None:
            request = GenerationRequest("c", PROMPT, SamplingSpec(ignore_eos=True))
            async with aclosing(engine.generate(request)) as steps:
                async for _ in steps:
                    first.set()

        task = asyncio.create_task(consume())
        await first.wait()
        assert engine.active_requests == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.active_requests == 0


class TestBatchSteps:
    """Decode steps are the batch's: one step gives every running request its next token."""

    async def test_requests_decoding_together_get_each_step_at_once(
        self, facts: TokenizerFacts
    ) -> None:
        engine = make_engine(facts, itl_s=0.02)
        loop = asyncio.get_running_loop()
        times: dict[str, list[float]] = {"a": [], "b": []}

        async def run(rid: str, delay: float) -> None:
            await asyncio.sleep(delay)
            request = GenerationRequest(rid, PROMPT, SamplingSpec(max_new_tokens=6))
            async with aclosing(engine.generate(request)) as steps:
                async for _ in steps:
                    times[rid].append(loop.time())

        # b starts a little after a; from its second token on, both are in the same steps
        await asyncio.gather(run("a", 0.0), run("b", 0.007))
        shared = [t for t in times["b"][1:] if any(abs(t - u) < 1e-3 for u in times["a"])]
        assert len(shared) >= 3, times

    async def test_an_abort_ends_only_its_own_wait(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts, context_length=100_000, itl_s=0.05)
        aborted: list[Step] = []

        async def victim() -> None:
            request = GenerationRequest("v", PROMPT, SamplingSpec(ignore_eos=True))
            async with aclosing(engine.generate(request)) as steps:
                async for step in steps:
                    aborted.append(step)
                    if len(aborted) == 1:
                        loop = asyncio.get_running_loop()
                        loop.call_soon(engine.abort, "v")  # while it waits for the step

        task = asyncio.create_task(victim())
        kept = await steps_of(engine, rid="other", max_new_tokens=3)
        await task
        assert aborted[-1].finish is not None and aborted[-1].finish.reason is FinishReason.ABORT
        assert len(tokens(kept)) == 3 and finish_of(kept).reason is FinishReason.LENGTH


class TestValidation:
    @pytest.mark.parametrize(
        ("prompt", "sampling"),
        [
            ((), {}),
            (tuple(range(100, 356)), {}),  # 256 tokens: no room under context 256
            ((10**7,), {}),
            (PROMPT, {"temperature": -1.0}),
            (PROMPT, {"max_new_tokens": 2, "min_new_tokens": 3}),
        ],
    )
    async def test_rejected(
        self, facts: TokenizerFacts, prompt: tuple[int, ...], sampling: dict[str, Any]
    ) -> None:
        with pytest.raises(RequestRejected):
            await steps_of(make_engine(facts), prompt=prompt, **sampling)

    async def test_duplicate_running_id(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts, itl_s=0.05)
        request = GenerationRequest("dup", PROMPT, SamplingSpec(ignore_eos=True))
        async with aclosing(engine.generate(request)) as steps:
            await anext(steps)
            with pytest.raises(RequestRejected):
                await steps_of(engine, rid="dup")
        assert engine.active_requests == 0

    async def test_loads_count_running_tokens(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts, itl_s=0.05)
        request = GenerationRequest("l", PROMPT, SamplingSpec(ignore_eos=True))
        async with aclosing(engine.generate(request)) as steps:
            await anext(steps)
            snap = engine.loads()
            assert snap.running_requests == 1 and snap.used_tokens == len(PROMPT) + 1
        assert engine.loads().running_requests == 0


LONG = tuple(range(1000, 1040))  # 40 tokens: two full blocks of 16 and 8 more


class TestKvCache:
    async def test_cached_tokens_on_every_step(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts)
        first = await steps_of(engine, prompt=LONG, max_new_tokens=3, ignore_eos=True)
        assert {s.cached_tokens for s in first} == {0}
        again = await steps_of(engine, prompt=LONG + (7,), max_new_tokens=3, ignore_eos=True)
        assert {s.cached_tokens for s in again} == {32}

    async def test_vllm_stores_output_blocks_as_they_fill(self, facts: TokenizerFacts) -> None:
        sink = Recorder()
        engine = make_engine(facts, policy=VLLM_POLICY, sink=sink)
        request = GenerationRequest("v", LONG, SamplingSpec(max_new_tokens=20, ignore_eos=True))
        seen_at: list[int] = []
        async with aclosing(engine.generate(request)) as steps:
            async for _ in steps:
                seen_at.append(len(sink.stored()))
        assert seen_at[0] == 1  # the prompt's two blocks, stored after prefill
        # block 2 (8 prompt + 8 output tokens) once the 8th output token is computed
        assert seen_at.index(2) == 8
        blocks = [h for e in sink.stored() for h in e.block_hashes]
        assert len(blocks) == 3  # 40 + 20 tokens, the last one uncomputed: 59 // 16

    async def test_sglang_stores_output_blocks_at_the_end(self, facts: TokenizerFacts) -> None:
        sink = Recorder()
        engine = make_engine(facts, policy=SGLANG_POLICY, sink=sink)
        request = GenerationRequest("s", LONG, SamplingSpec(max_new_tokens=20, ignore_eos=True))
        seen_at: list[int] = []
        async with aclosing(engine.generate(request)) as steps:
            async for _ in steps:
                seen_at.append(len(sink.stored()))
        assert set(seen_at) == {1}
        assert len(sink.stored()) == 2 and len(sink.stored()[1].block_hashes) == 1

    async def test_abort_during_prefill_stores_nothing(self, facts: TokenizerFacts) -> None:
        sink = Recorder()
        engine = make_engine(facts, sink=sink)
        engine.timing = Timing(prefill_base_s=5.0)
        request = GenerationRequest("a", LONG, SamplingSpec(ignore_eos=True))
        async with aclosing(engine.generate(request)) as steps:
            task = asyncio.ensure_future(anext(steps))
            await asyncio.sleep(0.01)
            assert engine.abort("a")
            step = await task
        assert step.finish is not None and step.finish.reason is FinishReason.ABORT
        assert sink.events == [] and engine.cache.pinned_blocks == 0

    async def test_cancel_unpins(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts, itl_s=0.05)
        request = GenerationRequest("c", LONG, SamplingSpec(ignore_eos=True))
        async with aclosing(engine.generate(request)) as steps:
            await anext(steps)
            assert engine.cache.pinned_blocks == 2
        assert engine.cache.pinned_blocks == 0 and engine.cache.cached_blocks >= 2

    async def test_loads_count_shared_blocks_once(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts, itl_s=0.05)
        await steps_of(engine, prompt=LONG, max_new_tokens=1)
        one = GenerationRequest("x", LONG, SamplingSpec(ignore_eos=True))
        two = GenerationRequest("y", LONG, SamplingSpec(ignore_eos=True))
        async with aclosing(engine.generate(one)) as a, aclosing(engine.generate(two)) as b:
            await anext(a)
            await anext(b)
            snap = engine.loads()
            assert snap.used_tokens == 32 + 2 * (8 + 1)  # two shared blocks, two private tails
            assert snap.cached_tokens >= 32 and snap.cache_hit_rate > 0

    async def test_flush_cache(self, facts: TokenizerFacts) -> None:
        sink = Recorder()
        engine = make_engine(facts, itl_s=0.05, sink=sink)
        request = GenerationRequest("f", LONG, SamplingSpec(ignore_eos=True))
        async with aclosing(engine.generate(request)) as steps:
            await anext(steps)
            assert not engine.flush_cache()
        assert engine.flush_cache()
        assert sink.events[-1] == AllBlocksCleared() and engine.cache.cached_blocks == 0


class TestWarmUp:
    """The vLLM servicer's warm-up: its requests store blocks, then reset_prefix_cache drops
    them at once but its AllBlocksCleared goes out only with the next request's step."""

    async def test_reset_is_published_at_the_next_step(self, facts: TokenizerFacts) -> None:
        sink = Recorder()
        engine = make_engine(facts, policy=VLLM_POLICY, sink=sink)
        warm = [tuple(range(2000 + 100 * i, 2032 + 100 * i)) for i in range(3)]
        await engine.warm_up(warm)
        assert len(sink.stored()) == 3 and engine.active_requests == 0
        assert engine.reset_prefix_cache()
        assert engine.cache.cached_blocks == 0
        assert AllBlocksCleared() not in sink.events  # held back: no step since
        before = len(sink.events)
        steps = await steps_of(engine, prompt=warm[0], max_new_tokens=1)
        assert steps[0].cached_tokens == 0  # the cache really was dropped
        assert sink.events[before] == AllBlocksCleared()
        assert sink.events.count(AllBlocksCleared()) == 1
        assert isinstance(sink.events[-1], BlockStored)  # then the request's own blocks

    async def test_no_reset_while_a_request_runs(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts, itl_s=0.05, policy=VLLM_POLICY, sink=Recorder())
        request = GenerationRequest("w", LONG, SamplingSpec(ignore_eos=True))
        async with aclosing(engine.generate(request)) as steps:
            await anext(steps)
            assert not engine.reset_prefix_cache()


class TestTransferredPrompt:
    async def test_counted_as_cached_without_prefill_cost(self, facts: TokenizerFacts) -> None:
        engine = make_engine(facts)
        engine.timing = Timing(prefill_base_s=1000.0, ttft_s=1000.0)  # a prefill would stall
        prompt = tuple(range(100, 140))
        request = GenerationRequest("d", prompt, SamplingSpec(max_new_tokens=3), 32)

        async def run() -> list[Step]:
            async with aclosing(engine.generate(request)) as steps:
                return [step async for step in steps]

        steps = await asyncio.wait_for(run(), 10.0)
        assert {step.cached_tokens for step in steps} == {32}
        reference = await steps_of(make_engine(facts), prompt=prompt, max_new_tokens=3)
        assert tokens(steps) == tokens(reference)  # the same tokens as aggregated
        assert engine.cache.cached_blocks == 2  # the transferred blocks are stored locally

    async def test_more_than_the_prompt_is_rejected(self, facts: TokenizerFacts) -> None:
        request = GenerationRequest("d", PROMPT, SamplingSpec(), len(PROMPT) + 1)
        with pytest.raises(RequestRejected):
            await anext(aiter(make_engine(facts).generate(request)))


class TestPrefillStallsDecode:
    """The busy window of --prefill-stalls-decode, on a hand-driven clock."""

    def engine(self, facts: TokenizerFacts, stalls: bool, now: list[float]) -> MockEngine:
        timing = Timing(itl_s=0.01, prefill_base_s=0.1, prefill_stalls_decode=stalls)
        return MockEngine(
            oracle=TokenOracle(facts.ordinary_ids, facts.eos_token_id),
            vocab_size=facts.vocab_size,
            context_length=256,
            cache=PrefixCache(
                block_size=16, num_blocks=64, hasher=EngineHasher(7), policy=SGLANG_POLICY
            ),
            timing=timing,
            token_text=facts.text_of,
            clock=lambda: now[0],
        )

    async def test_a_decode_step_waits_for_the_running_prefill(self, facts: TokenizerFacts) -> None:
        now = [0.0]
        engine = self.engine(facts, True, now)
        task = asyncio.create_task(steps_of(engine, prompt=range(1, 49), max_new_tokens=1))
        while not engine._prefill_slot.locked():
            await asyncio.sleep(0)
        assert engine._decode_delay() == pytest.approx(0.01 + 0.1)  # the prefill's 0.1 s
        now[0] = 0.3
        assert engine._decode_delay() == pytest.approx(0.01)  # the GPU is free again
        await task

    async def test_a_burst_sharing_a_new_prefix_hits_what_the_first_stored(
        self, facts: TokenizerFacts
    ) -> None:
        """Prefills run one at a time and match the cache when their turn comes: only the
        first of a burst computes the shared 32-token prefix."""
        engine = self.engine(facts, True, [0.0])
        shared = list(range(1, 33))
        burst = [
            steps_of(engine, prompt=shared + [100 + n] * 16, rid=f"r{n}", max_new_tokens=1)
            for n in range(3)
        ]
        answers = await asyncio.gather(*burst)
        assert [steps[0].cached_tokens for steps in answers] == [0, 32, 32]

    async def test_cancelled_while_queued_or_prefilling_pins_nothing(
        self, facts: TokenizerFacts
    ) -> None:
        engine = self.engine(facts, True, [0.0])
        tasks = [
            asyncio.create_task(steps_of(engine, prompt=range(1, 49), rid=f"r{n}"))
            for n in range(3)
        ]
        # Until the second prefills (it pins the prefix the first stored); the third waits.
        while "r1" not in engine._active or not engine._active["r1"].lease.held:
            await asyncio.sleep(0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert engine.cache.pinned_blocks == 0
        assert engine.active_requests == 0

    def test_off_by_default(self, facts: TokenizerFacts) -> None:
        now = [0.0]
        engine = self.engine(facts, False, now)
        engine._prefill_busy_until = 1.0
        assert engine._decode_delay() == pytest.approx(0.01)

    async def test_a_request_runs_with_stalls_on(self, facts: TokenizerFacts) -> None:
        engine = self.engine(facts, True, [0.0])
        steps = await steps_of(engine, max_new_tokens=3)
        assert len(tokens(steps)) == 3
