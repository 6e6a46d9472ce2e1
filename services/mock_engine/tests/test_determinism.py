"""One prompt, one output: on every engine, both protocols, and across a resume."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto import vllm_engine_pb2 as vpb

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = [1000, 2000, 3000, 4000, 5000, 6000, 7000]


async def sglang_tokens(stub: Any, rid: str, prompt: list[int], **params: Any) -> list[int]:
    req = spb.GenerateRequest(
        request_id=rid,
        tokenized=spb.TokenizedInput(input_ids=prompt),
        sampling_params=spb.SamplingParams(temperature=0.0, top_k=-1, **params),
        stream=True,
    )
    return [t async for r in stub.Generate(req) if r.HasField("chunk") for t in r.chunk.token_ids]


async def vllm_tokens(stub: Any, rid: str, prompt: list[int], **params: Any) -> list[int]:
    req = vpb.GenerateRequest(
        request_id=rid,
        tokenized=vpb.TokenizedInput(input_ids=prompt),
        sampling_params=vpb.SamplingParams(temperature=0.0, **params),
        stream=True,
    )
    return [t async for r in stub.Generate(req) if r.HasField("chunk") for t in r.chunk.token_ids]


class TestDeterminism:
    async def test_same_prompt_twice(self, sglang: Any) -> None:
        first = await sglang_tokens(sglang, "d1", PROMPT, max_new_tokens=30)
        assert first == await sglang_tokens(sglang, "d2", PROMPT, max_new_tokens=30)

    async def test_both_protocols_agree(self, sglang: Any, vllm: Any) -> None:
        s = await sglang_tokens(sglang, "x1", PROMPT, max_new_tokens=40, ignore_eos=True)
        v = await vllm_tokens(vllm, "x2", PROMPT, max_tokens=40, ignore_eos=True)
        assert s == v and len(s) == 40
        s_eos = await sglang_tokens(sglang, "x3", PROMPT)
        assert s_eos == await vllm_tokens(vllm, "x4", PROMPT)

    async def test_different_prompts_differ(self, sglang: Any) -> None:
        a = await sglang_tokens(sglang, "p1", PROMPT, max_new_tokens=10, ignore_eos=True)
        b = await sglang_tokens(sglang, "p2", PROMPT[:-1], max_new_tokens=10, ignore_eos=True)
        assert a != b

    @pytest.mark.parametrize("k", [1, 5, 17])
    async def test_resume_elsewhere_continues_exactly(self, sglang: Any, vllm: Any, k: int) -> None:
        whole = await sglang_tokens(sglang, f"r{k}", PROMPT, max_new_tokens=30, ignore_eos=True)
        rest = await vllm_tokens(
            vllm, f"r{k}b", PROMPT + whole[:k], max_tokens=30 - k, ignore_eos=True
        )
        assert whole[k:] == rest

    async def test_resume_keeps_the_eos_position(self, sglang: Any, vllm: Any) -> None:
        whole = await sglang_tokens(sglang, "e1", PROMPT)  # ends at its EOS
        k = len(whole) // 2
        assert whole[k:] == await vllm_tokens(vllm, "e2", PROMPT + whole[:k])


class TestConcurrency:
    async def test_many_concurrent_streams(self, sglang: Any) -> None:
        prompts = [[500 + i, 600 + i, 700] for i in range(150)]
        together = await asyncio.gather(
            *(
                sglang_tokens(sglang, f"c{i}", p, max_new_tokens=20, ignore_eos=True)
                for i, p in enumerate(prompts)
            )
        )
        assert all(len(out) == 20 for out in together)
        alone = await sglang_tokens(
            sglang, "c-alone", prompts[42], max_new_tokens=20, ignore_eos=True
        )
        assert together[42] == alone
