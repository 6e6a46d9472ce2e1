"""n samples, seeds, logprobs, prompt logprobs and logit_bias over real gRPC, both protocols,
shaped as each engine's servicer shapes them."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto import vllm_engine_pb2 as vpb
from support.mock_engine import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = [100, 200, 300, 400, 500]
PROTOCOLS = ["sglang", "vllm"]


def request(protocol: str, rid: str, *, stream: bool = True, top: int | None = None,
            prompt_top: int | None = None, n: int = 1, **params: Any) -> Any:  # fmt: skip
    """A Generate request; `top` asks for output logprobs, `prompt_top` for prompt logprobs."""
    params.setdefault("temperature", 0.0)
    if protocol == "sglang":
        if "max_tokens" in params:
            params["max_new_tokens"] = params.pop("max_tokens")
        bias = params.pop("logit_bias", {})
        sampling = spb.SamplingParams(n=n, **params)
        sampling.logit_bias.update({str(k): v for k, v in bias.items()})
        built = spb.GenerateRequest(
            request_id=rid,
            tokenized=spb.TokenizedInput(input_ids=PROMPT),
            sampling_params=sampling,
            stream=stream,
            logprob_start_len=0 if prompt_top is not None else -1,
        )
        if top is not None or prompt_top is not None:
            built.return_logprob = True
            built.top_logprobs_num = max(top or 0, prompt_top or 0)
        return built
    sampling = vpb.SamplingParams(n=n, **params)
    if top is not None:
        sampling.logprobs = top
    if prompt_top is not None:
        sampling.prompt_logprobs = prompt_top
    return vpb.GenerateRequest(
        request_id=rid,
        tokenized=vpb.TokenizedInput(input_ids=PROMPT),
        sampling_params=sampling,
        stream=stream,
    )


def stub(protocol: str, sglang: Any, vllm: Any) -> Any:
    return sglang if protocol == "sglang" else vllm


async def collect(engine: Any, req: Any) -> list[Any]:
    return [reply async for reply in engine.Generate(req)]


async def read_rest(call: Any) -> list[Any]:
    """The replies still to come on a call already read with `read()`."""
    out = []
    while (reply := await call.read()) is not grpc.aio.EOF:
        out.append(reply)
    return out


def by_index(replies: list[Any]) -> dict[int, list[int]]:
    """Output ids per sample, from chunks (streaming) or completes (not)."""
    out: dict[int, list[int]] = {}
    streamed = any(r.HasField("chunk") for r in replies)
    for r in replies:
        part = r.chunk if streamed and r.HasField("chunk") else None
        if part is None and not streamed and r.HasField("complete"):
            part = r.complete
            out.setdefault(part.index, []).extend(part.output_ids)
        elif part is not None:
            out.setdefault(part.index, []).extend(part.token_ids)
    return out


class TestSamples:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    @pytest.mark.parametrize("stream", [True, False])
    async def test_n_samples_each_with_its_index_and_complete(
        self, protocol: str, stream: bool, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        # ignore_eos: two samples that are each EOS alone (1 in 40 each) would be equal
        req = request(
            protocol,
            f"n3-{stream}",
            stream=stream,
            n=3,
            temperature=1.0,
            max_tokens=12,
            ignore_eos=True,
        )
        replies = await collect(engine, req)
        completes = [r.complete for r in replies if r.HasField("complete")]
        assert sorted(c.index for c in completes) == [0, 1, 2]
        outputs = by_index(replies)
        assert sorted(outputs) == [0, 1, 2]
        assert len({tuple(o) for o in outputs.values()}) == 3  # sampled: distinct samples
        for done in completes:
            if not stream:
                assert list(done.output_ids) == outputs[done.index]
        if not stream:  # one answer once every sample is done, in index order
            assert [r.complete.index for r in replies] == [0, 1, 2]

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_greedy_samples_are_identical(
        self, protocol: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        outputs = by_index(await collect(engine, request(protocol, "n2g", n=2, max_tokens=10)))
        assert outputs[0] == outputs[1]

    async def test_vllm_seed_reproduces_and_each_sample_gets_seed_plus_index(
        self, vllm: Any
    ) -> None:
        def seeded(rid: str, seed: int, n: int = 1) -> Any:
            return request("vllm", rid, n=n, temperature=1.0, seed=seed, max_tokens=12)

        twice = [by_index(await collect(vllm, seeded(f"s{i}", 7))) for i in range(2)]
        assert twice[0] == twice[1]
        other = by_index(await collect(vllm, seeded("s-other", 8)))
        assert other[0] != twice[0][0]
        pair = by_index(await collect(vllm, seeded("s-pair", 7, n=2)))
        assert pair[0] == twice[0][0] and pair[1] == other[0]

    async def test_sglang_abort_of_an_n_request_ends_every_sample(
        self, sglang: Any, sglang_engine: Any
    ) -> None:
        req = request("sglang", "n-abort", n=2, temperature=1.0, max_tokens=100000, ignore_eos=True)
        call = sglang.Generate(req)
        await call.read()
        await sglang.Abort(spb.AbortRequest(request_id="n-abort"))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await read_rest(call)
        assert raised.value.code() == grpc.StatusCode.INTERNAL
        await wait_until(lambda: sglang_engine.engine.active_requests == 0)

    async def test_vllm_abort_of_an_n_request_completes_every_sample(self, vllm: Any) -> None:
        req = request("vllm", "n-abort", n=2, temperature=1.0, max_tokens=100000, ignore_eos=True)
        call = vllm.Generate(req)
        await call.read()
        await vllm.Abort(vpb.AbortRequest(request_ids=["n-abort"]))
        replies = await read_rest(call)
        aborted = [r.complete for r in replies if r.HasField("complete")]
        assert sorted(c.index for c in aborted) == [0, 1]
        assert {c.finish_reason for c in aborted} == {"abort"}


class TestLogprobs:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_each_chunk_carries_its_tokens_logprobs(
        self, protocol: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        replies = await collect(engine, request(protocol, "lp", top=3, max_tokens=8))
        chunks = [r.chunk for r in replies if r.HasField("chunk")]
        for chunk in chunks:
            lp = chunk.output_logprobs
            assert list(lp.token_ids) == list(chunk.token_ids)
            assert len(lp.token_logprobs) == len(chunk.token_ids) == len(lp.top_logprobs)
            for value, token, top in zip(
                lp.token_logprobs, lp.token_ids, lp.top_logprobs, strict=True
            ):
                assert len(top.token_ids) == 3 and top.token_ids[0] == token  # emitted = argmax
                assert top.values[0] == pytest.approx(value)
                assert list(top.values) == sorted(top.values, reverse=True) and value < 0
        done = replies[-1].complete  # a streamed complete repeats the last chunk's
        assert list(done.output_logprobs.token_ids) == list(chunks[-1].output_logprobs.token_ids)

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_non_streaming_complete_has_them_all_and_calls_agree(
        self, protocol: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        streamed = await collect(engine, request(protocol, "lp-s", top=2, max_tokens=8))
        whole = (
            await collect(engine, request(protocol, "lp-n", stream=False, top=2, max_tokens=8))
        )[-1]
        values = [
            v
            for r in streamed
            if r.HasField("chunk")
            for v in r.chunk.output_logprobs.token_logprobs
        ]
        assert list(whole.complete.output_logprobs.token_logprobs) == pytest.approx(values)
        assert list(whole.complete.output_logprobs.token_ids) == list(whole.complete.output_ids)

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_zero_alternatives_still_gives_the_tokens_logprob(
        self, protocol: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        replies = await collect(engine, request(protocol, "lp0", top=0, max_tokens=3))
        lp = replies[0].chunk.output_logprobs
        assert len(lp.token_logprobs) == 1 and not lp.top_logprobs

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_no_logprobs_unless_asked(self, protocol: str, sglang: Any, vllm: Any) -> None:
        engine = stub(protocol, sglang, vllm)
        replies = await collect(engine, request(protocol, "lp-none", max_tokens=3))
        assert not any(r.chunk.HasField("output_logprobs") for r in replies if r.HasField("chunk"))


class TestPromptLogprobs:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    @pytest.mark.parametrize("stream", [True, False])
    async def test_every_prompt_token_once(
        self, protocol: str, stream: bool, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        replies = await collect(
            engine, request(protocol, f"echo-{stream}", stream=stream, prompt_top=2, max_tokens=4)
        )
        carrying = [
            r
            for r in replies
            if (r.chunk if r.HasField("chunk") else r.complete).HasField("input_logprobs")
        ]
        first = replies[0].chunk if stream else replies[0].complete
        assert carrying and (carrying[0].chunk if stream else carrying[0].complete) == first
        inputs = first.input_logprobs
        assert list(inputs.token_ids) == PROMPT
        assert not inputs.token_logprobs[0].HasField("value")
        assert all(e.HasField("value") for e in inputs.token_logprobs[1:])
        assert len(inputs.top_logprobs) == len(PROMPT) and not inputs.top_logprobs[0].token_ids
        tops = inputs.top_logprobs[1:]
        if protocol == "vllm":  # vLLM's dict starts with the scored prompt token
            assert [t.token_ids[0] for t in tops] == PROMPT[1:]
        else:  # SGLang's top list is the most likely tokens
            assert all(list(t.values) == sorted(t.values, reverse=True) for t in tops)
        assert len(carrying) == 1 if stream else True

    async def test_sglang_logprob_start_len_skips_leading_positions(self, sglang: Any) -> None:
        req = request("sglang", "start2", prompt_top=0, max_tokens=2)
        req.logprob_start_len = 2
        first = (await collect(sglang, req))[0].chunk
        assert list(first.input_logprobs.token_ids) == PROMPT[2:]
        assert all(e.HasField("value") for e in first.input_logprobs.token_logprobs)

    async def test_vllm_refuses_more_than_max_logprobs(self, vllm: Any) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(vllm, request("vllm", "too-many", prompt_top=21, max_tokens=2))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "greater than max allowed: 20" in (raised.value.details() or "")


class TestLogitBias:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_plus_100_forces_and_minus_100_bans(
        self, protocol: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        free = by_index(
            await collect(engine, request(protocol, "b0", max_tokens=6, ignore_eos=True))
        )[0]
        forced = by_index(
            await collect(
                engine,
                request(protocol, "b1", max_tokens=6, ignore_eos=True, logit_bias={4242: 100.0}),
            )
        )[0]
        assert forced == [4242] * 6
        banned = by_index(
            await collect(
                engine,
                request(
                    protocol, "b2", max_tokens=6, ignore_eos=True, logit_bias={free[0]: -100.0}
                ),
            )
        )[0]
        assert banned[0] != free[0] and free[0] not in banned

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_out_of_vocabulary_bias_is_refused(
        self, protocol: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(engine, request(protocol, "oov", max_tokens=2, logit_bias={10**7: 1.0}))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "logit_bias" in (raised.value.details() or "")

    async def test_sglang_bias_keys_must_be_token_ids(self, sglang: Any) -> None:
        req = request("sglang", "badkey", max_tokens=2)
        req.sampling_params.logit_bias["hello"] = 1.0
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(sglang, req)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
