"""Simulated timing: prefill by uncached tokens (superlinear), decode by batch, the speedup,
and the engine's own first-token delay falling once a prefix is cached."""

from __future__ import annotations

import random
from contextlib import aclosing

import pytest

from switchyard.mock_engine.config import MockEngineConfig, default_tokenizer_dir
from switchyard.mock_engine.generation import MockEngine
from switchyard.mock_engine.kv_cache import SGLANG_POLICY, VLLM_POLICY, EngineHasher, PrefixCache
from switchyard.mock_engine.timing import Timing
from switchyard.mock_engine.tokenizer_facts import TokenizerFacts, load_tokenizer_facts
from switchyard.mock_engine.tokens import TokenOracle
from switchyard.mock_engine.types import GenerationRequest, SamplingSpec

TIMING = Timing(
    ttft_s=0.02,
    itl_s=0.005,
    prefill_base_s=0.005,
    prefill_per_token_s=0.00005,
    prefill_superlinear_tokens=8192,
    batch_slowdown=0.02,
)


class TestTiming:
    def test_prefill_formula(self) -> None:
        assert TIMING.prefill_s(0) == pytest.approx(0.005)
        assert TIMING.prefill_s(8192) == pytest.approx(0.005 + 0.00005 * 8192 * 2)
        assert TIMING.first_token_s(100) == pytest.approx(TIMING.prefill_s(100) + 0.02)

    def test_prefill_grows_superlinearly(self) -> None:
        costs = [TIMING.prefill_s(n) - TIMING.prefill_base_s for n in (1000, 2000, 4000, 8000)]
        assert costs == sorted(costs)
        assert all(b > 2 * a for a, b in zip(costs, costs[1:], strict=False))

    def test_decode_step_grows_with_the_batch(self) -> None:
        assert TIMING.decode_step_s(0) == pytest.approx(0.005)
        assert TIMING.decode_step_s(50) == pytest.approx(0.005 * 2)
        steps = [TIMING.decode_step_s(n) for n in range(0, 200, 10)]
        assert steps == sorted(steps)

    def test_config_applies_the_speedup(self) -> None:
        config = MockEngineConfig(
            protocol="sglang",
            port=0,
            ttft_ms=20,
            itl_ms=5,
            prefill_base_ms=5,
            prefill_ms_per_token=0.05,
            batch_slowdown=0.5,
            speedup=10,
        )
        timing = config.timing
        assert timing.ttft_s == pytest.approx(0.002) and timing.itl_s == pytest.approx(0.0005)
        assert timing.prefill_base_s == pytest.approx(0.0005)
        assert timing.prefill_per_token_s == pytest.approx(0.000005)
        assert timing.batch_slowdown == 0.5  # a ratio: not scaled


@pytest.fixture(scope="module")
def facts() -> TokenizerFacts:
    return load_tokenizer_facts(default_tokenizer_dir())


@pytest.mark.parametrize("policy", [SGLANG_POLICY, VLLM_POLICY])
class TestCachedPrefixIsFaster:
    async def test_first_token_delay_falls_with_the_cached_prefix(
        self, facts: TokenizerFacts, policy: object
    ) -> None:
        engine = MockEngine(
            oracle=TokenOracle(facts.ordinary_ids, facts.eos_token_id),
            vocab_size=facts.vocab_size,
            context_length=8192,
            cache=PrefixCache(
                block_size=16,
                num_blocks=512,
                hasher=EngineHasher(3),
                policy=policy,  # type: ignore[arg-type]
            ),
            timing=Timing(prefill_base_s=0.0001, prefill_per_token_s=1e-7),  # fast, same shape
            token_text=facts.text_of,
            rng=random.Random(1),
        )
        system = list(range(1000, 3000))
        cold = engine.first_token_delay_s(system + [5, 6, 7])
        request = GenerationRequest("warm", tuple(system + [1]), SamplingSpec(max_new_tokens=1))
        async with aclosing(engine.generate(request)) as steps:
            first = [step async for step in steps]
        assert first[0].cached_tokens == 0
        warm = engine.first_token_delay_s(system + [5, 6, 7])
        assert warm < cold
        assert warm == pytest.approx(engine.timing.first_token_s(2003 - 2000))
        request = GenerationRequest(
            "hit", tuple(system + [5, 6, 7]), SamplingSpec(max_new_tokens=1)
        )
        async with aclosing(engine.generate(request)) as steps:
            hit = [step async for step in steps]
        assert hit[0].cached_tokens == 2000
