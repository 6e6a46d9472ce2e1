"""A client that goes away mid-stream: the engine is told to drop the request."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from e2e_stack import running_stack

from switchyard.common.engines import connect


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def slow_stack(request):
    # 50 ms per token (x4 speedup in the test stack): a 2000-token answer takes minutes.
    with running_stack("--mock-engines", request.param, "--mock-itl-ms", "200") as stack:
        yield stack


async def running_requests(url: str) -> int:
    client = await connect(url)
    try:
        return (await client.load(timeout=2)).running
    finally:
        await client.close()


def test_disconnect_aborts_the_engine_request(slow_stack):
    [url] = slow_stack.engine_urls()
    body = {
        "model": "deepseek-mock",
        "prompt": "a long story",
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=slow_stack.base_url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as reply:
            assert reply.status_code == 200
            chunks = reply.iter_lines()
            seen = [next(chunks) for _ in range(3)]
            assert all(line.startswith("data: ") or not line for line in seen)
            assert asyncio.run(running_requests(url)) == 1
    # The connection is closed: the engine must drop the request promptly.
    deadline = time.monotonic() + 10
    while asyncio.run(running_requests(url)) != 0:
        assert time.monotonic() < deadline, "the engine still runs the abandoned request"
        time.sleep(0.1)


def test_disconnect_from_a_non_streaming_request_aborts_it_too(slow_stack):
    """Regression test for issue 14: a client that left a non-streaming request kept its
    engine request running to the end (0 of 8 aborted)."""
    [url] = slow_stack.engine_urls()
    body = {
        "model": "deepseek-mock",
        "prompt": "a long story",
        "max_tokens": 2000,
        "ignore_eos": True,
    }

    async def leave_early() -> None:
        async with httpx.AsyncClient(base_url=slow_stack.base_url, timeout=30) as http:
            request = asyncio.create_task(http.post("/v1/completions", json=body))
            deadline = time.monotonic() + 10
            while await running_requests(url) != 1:
                assert time.monotonic() < deadline, "the request never reached the engine"
                await asyncio.sleep(0.05)
            request.cancel()  # closes the connection before any answer
            with pytest.raises(asyncio.CancelledError):
                await request

    asyncio.run(leave_early())
    deadline = time.monotonic() + 10
    while asyncio.run(running_requests(url)) != 0:
        assert time.monotonic() < deadline, "the engine still runs the abandoned request"
        time.sleep(0.1)
