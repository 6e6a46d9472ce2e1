"""Fault injection: refused calls (seeded), hung requests, a crash after N tokens in total."""

from __future__ import annotations

import asyncio
import contextlib
import random
from contextlib import aclosing
from typing import Any

import grpc
import pytest
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as spb_grpc
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from support.mock_engine import spawn_mock_engine, start_mock_engine, wait_until

from switchyard.mock_engine.config import MockEngineConfig, default_tokenizer_dir
from switchyard.mock_engine.errors import ConfigError
from switchyard.mock_engine.faults import CRASH_EXIT_CODE, FaultInjector, Refusal
from switchyard.mock_engine.generation import MockEngine
from switchyard.mock_engine.kv_cache import SGLANG_POLICY, EngineHasher, PrefixCache
from switchyard.mock_engine.timing import Timing
from switchyard.mock_engine.tokenizer_facts import load_tokenizer_facts
from switchyard.mock_engine.tokens import TokenOracle
from switchyard.mock_engine.types import GenerationRequest, SamplingSpec

FAST: dict[str, Any] = {"port": 0, "speedup": 1000.0, "context_length": 512}
PROMPT = [100, 200, 300, 400, 500]


def sglang_request(rid: str, **params: Any) -> Any:
    return spb.GenerateRequest(
        request_id=rid,
        tokenized=spb.TokenizedInput(input_ids=PROMPT),
        sampling_params=spb.SamplingParams(temperature=0.0, top_k=-1, **params),
        stream=True,
    )


def vllm_request(rid: str, **params: Any) -> Any:
    return vpb.GenerateRequest(
        request_id=rid,
        tokenized=vpb.TokenizedInput(input_ids=PROMPT),
        sampling_params=vpb.SamplingParams(temperature=0.0, **params),
        stream=True,
    )


async def outcome(stub: Any, request: Any) -> str:
    """ "ok" for a completed call, else its status code's name."""
    try:
        replies = [reply async for reply in stub.Generate(request)]
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    assert replies[-1].HasField("complete")
    return "ok"


class TestInjector:
    def test_draws_are_deterministic_given_the_seed(self) -> None:
        def verdicts(seed: int) -> list[Refusal | None]:
            faults = FaultInjector(
                fail_unavailable=0.25, fail_overloaded=0.25, rng=random.Random(seed)
            )
            return [faults.admit() for _ in range(200)]

        first = verdicts(3)
        assert first == verdicts(3)
        assert {Refusal.UNAVAILABLE, Refusal.OVERLOADED, None} == set(first)
        assert 20 < first.count(Refusal.UNAVAILABLE) < 80
        assert 20 < first.count(Refusal.OVERLOADED) < 80

    def test_off_by_default(self) -> None:
        faults = FaultInjector()
        assert all(faults.admit() is None for _ in range(50))
        assert not faults.hangs_at(10**6)

    def test_hangs_at(self) -> None:
        faults = FaultInjector(hang_after_tokens=2)
        assert [faults.hangs_at(n) for n in range(4)] == [False, False, True, True]

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("fail_unavailable", -0.1),
            ("fail_unavailable", 1.5),
            ("fail_overloaded", float("nan")),
            ("exit_after_tokens", 0),
            ("hang_after_tokens", -1),
            ("fault_seed", -1),
        ],
    )
    def test_bad_values_fail_loudly(self, field: str, value: Any) -> None:
        with pytest.raises(ConfigError) as raised:
            MockEngineConfig(protocol="vllm", port=1, **{field: value})
        assert raised.value.field == field

    def test_fractions_must_not_exceed_one_together(self) -> None:
        with pytest.raises(ConfigError):
            MockEngineConfig(protocol="vllm", port=1, fail_unavailable=0.6, fail_overloaded=0.6)


class TestCrashCount:
    async def test_crash_once_the_total_is_reached(self) -> None:
        facts = load_tokenizer_facts(default_tokenizer_dir())
        totals: list[int] = []
        engine: MockEngine | None = None

        def crash() -> None:
            assert engine is not None
            totals.append(engine.tokens_generated)

        engine = MockEngine(
            oracle=TokenOracle(facts.ordinary_ids, facts.eos_token_id),
            vocab_size=facts.vocab_size,
            context_length=256,
            cache=PrefixCache(
                block_size=16, num_blocks=64, hasher=EngineHasher(7), policy=SGLANG_POLICY
            ),
            timing=Timing(),
            token_text=facts.text_of,
            faults=FaultInjector(exit_after_tokens=3, crash=crash),
        )
        spec = SamplingSpec(max_new_tokens=2, ignore_eos=True)
        for rid in ("a", "b"):
            request = GenerationRequest(rid, tuple(PROMPT), spec)
            async with aclosing(engine.generate(request)) as steps:
                async for _ in steps:
                    pass
        assert totals == [3, 4]  # the first request's 2, then the second's first token


class TestRefusals:
    async def test_unavailable(self) -> None:
        config = MockEngineConfig(protocol="sglang", fail_unavailable=1.0, **FAST)
        async with start_mock_engine(config) as engine:
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = spb_grpc.SglangSchedulerStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await stub.Generate(sglang_request("u", max_new_tokens=3)).read()
                assert (await stub.HealthCheck(spb.HealthCheckRequest())).healthy
            assert engine.engine is not None and engine.engine.total_requests == 0
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "--fail-unavailable" in (raised.value.details() or "")

    async def test_overloaded(self) -> None:
        config = MockEngineConfig(protocol="vllm", fail_overloaded=1.0, **FAST)
        async with start_mock_engine(config) as engine:
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = vpb_grpc.VllmEngineStub(channel)
                assert await outcome(stub, vllm_request("o", max_tokens=3)) == "RESOURCE_EXHAUSTED"

    async def test_seeded_mix_is_reproducible(self) -> None:
        fractions = {"fail_unavailable": 0.3, "fail_overloaded": 0.3}
        expected_faults = FaultInjector(**fractions, rng=random.Random(11))
        names = {None: "ok", Refusal.UNAVAILABLE: "UNAVAILABLE"}
        names[Refusal.OVERLOADED] = "RESOURCE_EXHAUSTED"
        expected = [names[expected_faults.admit()] for _ in range(20)]
        assert {"ok", "UNAVAILABLE", "RESOURCE_EXHAUSTED"} == set(expected)
        config = MockEngineConfig(protocol="vllm", fault_seed=11, **fractions, **FAST)
        async with start_mock_engine(config) as engine:
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = vpb_grpc.VllmEngineStub(channel)
                seen = [await outcome(stub, vllm_request(f"m{i}", max_tokens=2)) for i in range(20)]
            assert engine.engine is not None
            assert engine.engine.total_requests == expected.count("ok")
        assert seen == expected


class TestHang:
    async def test_stream_goes_silent_and_stays_open(self) -> None:
        config = MockEngineConfig(protocol="sglang", hang_after_tokens=3, **FAST)
        async with start_mock_engine(config) as engine:
            core = engine.engine
            assert core is not None
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = spb_grpc.SglangSchedulerStub(channel)
                call = stub.Generate(sglang_request("h", max_new_tokens=10, ignore_eos=True))
                got = [await call.read() for _ in range(3)]
                assert [r.chunk.completion_tokens for r in got] == [1, 2, 3]
                await wait_until(lambda: core.hung_requests == 1)
                pending = asyncio.ensure_future(call.read())
                abort = await stub.Abort(spb.AbortRequest(request_id="h"))
                assert abort.success  # found, but a hung engine does not act on it
                await asyncio.sleep(0.05)
                assert not pending.done() and core.hung_requests == 1
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await pending
                await wait_until(lambda: core.active_requests == 0)

    async def test_zero_hangs_before_the_first_token(self) -> None:
        config = MockEngineConfig(protocol="vllm", hang_after_tokens=0, **FAST)
        async with start_mock_engine(config) as engine:
            core = engine.engine
            assert core is not None
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = vpb_grpc.VllmEngineStub(channel)
                call = stub.Generate(vllm_request("z", max_tokens=5))
                pending = asyncio.ensure_future(call.read())
                await wait_until(lambda: core.hung_requests == 1)
                assert not pending.done()
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await pending
                await wait_until(lambda: core.active_requests == 0)

    async def test_short_requests_still_finish(self) -> None:
        config = MockEngineConfig(protocol="vllm", hang_after_tokens=3, **FAST)
        async with start_mock_engine(config) as engine:
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = vpb_grpc.VllmEngineStub(channel)
                request = vllm_request("s", max_tokens=3, ignore_eos=True)
                assert await outcome(stub, request) == "ok"


class TestExitAfterTokens:
    async def test_process_dies_mid_stream(self) -> None:
        args = ("--speedup", "100", "--exit-after-tokens", "5")
        async with spawn_mock_engine("vllm", *args) as engine:
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = vpb_grpc.VllmEngineStub(channel)
                request = vllm_request("x", max_tokens=50, ignore_eos=True)
                received: list[int] = []
                with pytest.raises(grpc.aio.AioRpcError):
                    async for reply in stub.Generate(request, timeout=30):
                        assert not reply.HasField("complete")  # never a graceful end
                        received.extend(reply.chunk.token_ids)
            await wait_until(lambda: engine.process.poll() is not None, timeout_s=30)
            assert engine.process.returncode == CRASH_EXIT_CODE
        assert 1 <= len(received) <= 5
