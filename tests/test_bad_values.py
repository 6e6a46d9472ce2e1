"""Values the engine protocol cannot hold, through the real stack (issue 14): `top_k` >= 2^31
on SGLang, or a `seed` outside int32 on vLLM, made `build_request` raise in the dispatcher;
the task died without a reply and the client waited 60 s per engine for a 503. Now the client
gets a clean 400 at once (well within a 5 s client timeout, with the idle timeout at 60 s), and
a dispatcher reached without the edge's checks answers bad_request itself."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from e2e_stack import running_stack

from switchyard.common import errors
from switchyard.preprocessor.dispatcher_client import DispatcherClient
from switchyard.protos.messages import GenerateFailed, GenerateRequest, SamplingParams

MODEL = "deepseek-mock"
IDLE = "--preprocessor-arg=--stream-idle-timeout=60"


@pytest.mark.parametrize(
    ("protocol", "extra"),
    [("sglang", {"top_k": 2**31}), ("vllm", {"top_k": 2**32}), ("vllm", {"seed": 2**31})],
)
def test_a_value_the_engine_cannot_hold_gets_a_clean_error(protocol, extra):
    with running_stack("--mock-engines", protocol, IDLE) as stack:
        with openai.OpenAI(
            base_url=stack.base_url + "/v1", api_key="none", max_retries=0, timeout=5
        ) as client:
            for stream in (False, True):
                with pytest.raises(openai.BadRequestError) as caught:
                    reply = client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": "hi"}],
                        max_tokens=4,
                        stream=stream,
                        extra_body=extra,
                    )
                    if stream:
                        list(reply)
                assert caught.value.status_code == 400
            # The stack still serves (greedy: a sampled answer may draw EOS within 2 tokens).
            ok = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
                temperature=0,
            )
            assert ok.choices[0].finish_reason == "length"


def test_the_dispatcher_answers_bad_request_itself():
    """Past the edge's validation (another client of the dispatcher's protocol), the
    dispatcher still answers: one GenerateFailed of kind bad_request."""
    with running_stack("--mock-engines", "sglang", IDLE) as stack:
        report = stack.report()
        (instance_id,) = {w["instance_id"] for w in _workers(stack.base_url)}
        endpoint = report["children"]["dispatcher-0"]["bind"]

        async def ask() -> object:
            client = DispatcherClient([endpoint], wait_s=30)
            client.start()
            try:
                sampling = SamplingParams(max_tokens=4, top_k=2**31)
                stream = await client.open(
                    GenerateRequest(
                        request_id="raw-1",
                        instance_id=instance_id,
                        token_ids=[1, 2, 3],
                        sampling=sampling,
                    )  # fmt: skip
                )
                async with asyncio.timeout(10):  # not the 60 s idle timeout
                    return await stream.queue.get()
            finally:
                await client.close()

        reply = asyncio.run(ask())
        assert isinstance(reply, GenerateFailed) and reply.kind == errors.BAD_REQUEST
        assert "generation failed" in stack.log()


def _workers(base: str) -> list[dict]:
    body = {"model": MODEL, "prompt": "x"}
    return httpx.post(base + "/debug/route", json=body, timeout=10).json()["workers"]
