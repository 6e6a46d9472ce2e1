"""10x overload: the preprocessor admits what its limits allow and answers the rest 429 with
Retry-After (OpenAI-shaped), never a 5xx; every admitted request completes; its memory stays
bounded. Deadlines: a request past --request-timeout (or its request-timeout-ms header) is
aborted on the engine (the mock engine counts aborts) and the client gets 504, or an error
event once its stream started."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from e2e_stack import running_stack, wait_until

MODEL = "deepseek-mock"
CONCURRENT, QUEUED = 4, 4
CLIENTS = 10 * (CONCURRENT + QUEUED)


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


async def offered(base: str, seconds: float) -> list[tuple[int, str | None, dict]]:
    """CLIENTS closed-loop clients for `seconds`: (status, Retry-After, body) of each reply."""
    out: list[tuple[int, str | None, dict]] = []
    limits = httpx.Limits(max_connections=CLIENTS + 8)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as http:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds

        async def client(n: int) -> None:
            while loop.time() < end:
                body = {"model": MODEL, "prompt": f"client {n}", "max_tokens": 16}
                body["ignore_eos"] = True
                reply = await http.post("/v1/completions", json=body)
                out.append((reply.status_code, reply.headers.get("retry-after"), reply.json()))
                if reply.status_code == 429:
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(client(n) for n in range(CLIENTS)))
    return out


def rejections(base: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    found = re.findall(r"^switchyard_preprocessor_admission_rejected_total\S* (\S+)$", text, re.M)
    return sum(float(n) for n in found)


class TestOverload:
    def test_ten_times_capacity(self):
        with running_stack(
            "--mock-engines", "sglang,vllm",
            "--max-concurrent-requests", str(CONCURRENT),
            "--max-queued-requests", str(QUEUED),
            "--queue-timeout", "5",
        ) as stack:  # fmt: skip
            pid = stack.pid("preprocessor")
            asyncio.run(offered(stack.base_url, 1.0))  # warm up: tokenizer, allocator
            before = peak_rss_kib(pid)
            rejected_before = rejections(stack.base_url)
            replies = asyncio.run(offered(stack.base_url, 6.0))
            after = peak_rss_kib(pid)
            rejected = rejections(stack.base_url) - rejected_before
        assert rejected == sum(1 for s, _, _ in replies if s == 429)  # and /metrics says so
        statuses = [status for status, _, _ in replies]
        assert set(statuses) <= {200, 429}, sorted(set(statuses))
        admitted = [body for status, _, body in replies if status == 200]
        limited = [(after, body) for status, after, body in replies if status == 429]
        assert admitted and limited
        for body in admitted:  # every admitted request ran to the end
            assert body["usage"]["completion_tokens"] == 16
            assert body["choices"][0]["finish_reason"] == "length"
        for retry_after, body in limited:
            assert retry_after is not None and int(retry_after) >= 1
            assert body["error"]["code"] == "rate_limit_exceeded"
            assert body["error"]["type"] == "rate_limit_error"
        # Bounded: 80 clients hammering cost the preprocessor little beyond its warm-up peak.
        assert after - before < 64 * 1024, (before, after)


def mock_metric(stack, engine: str, name: str) -> float:
    port = stack.report()["children"][engine]["metrics_port"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return float(re.search(rf"^switchyard_mock_engine_{name} (\S+)$", text, re.M)[1])


@pytest.fixture(scope="module")
def slow_stack():
    # 50 ms a token (200 ms / --mock-speedup 4): 2000 tokens take far longer than any deadline.
    with running_stack(
        "--mock-engines", "vllm", "--mock-itl-ms", "200", "--mock-arg=--metrics-port=0",
        "--request-timeout", "2",
    ) as stack:  # fmt: skip
        stack.engine = "mock-engine-0-vllm"
        yield stack


LONG = {"model": MODEL, "prompt": "a long story", "max_tokens": 2000, "ignore_eos": True}


def aborted_once_more(stack, before: float) -> None:
    wait_until(
        lambda: mock_metric(stack, stack.engine, "aborts_total") == before + 1,
        timeout=20,
        what="the engine counting the abort",
    )
    wait_until(
        lambda: mock_metric(stack, stack.engine, "running_requests") == 0,
        timeout=20,
        what="nothing left running",
    )


class TestDeadlines:
    def test_non_streaming_past_the_server_deadline_is_504_and_aborted(self, slow_stack):
        before = mock_metric(slow_stack, slow_stack.engine, "aborts_total")
        reply = httpx.post(slow_stack.base_url + "/v1/completions", json=LONG, timeout=60)
        assert reply.status_code == 504
        assert reply.json()["error"]["code"] == "request_timeout"
        aborted_once_more(slow_stack, before)

    def test_streaming_past_the_client_deadline_ends_with_an_error_event(self, slow_stack):
        before = mock_metric(slow_stack, slow_stack.engine, "aborts_total")
        lines = []
        with httpx.stream(
            "POST",
            slow_stack.base_url + "/v1/completions",
            json={**LONG, "stream": True},
            headers={"request-timeout-ms": "1000"},
            timeout=60,
        ) as reply:
            assert reply.status_code == 200
            lines = [line for line in reply.iter_lines() if line]
        assert any('"text"' in line for line in lines)  # tokens came first
        assert '"code":"request_timeout"' in lines[-2].replace(" ", "")
        assert lines[-1] == "data: [DONE]"
        aborted_once_more(slow_stack, before)

    def test_a_bad_deadline_header_is_400(self, slow_stack):
        for value in ("soon", "-5", "0", "inf"):
            reply = httpx.post(
                slow_stack.base_url + "/v1/completions",
                json=LONG,
                headers={"request-timeout-ms": value},
                timeout=30,
            )
            assert reply.status_code == 400
            assert reply.json()["error"]["param"] == "request-timeout-ms"

    def test_a_request_within_its_deadline_completes(self, slow_stack):
        body = {"model": MODEL, "prompt": "short", "max_tokens": 4, "ignore_eos": True}
        reply = httpx.post(slow_stack.base_url + "/v1/completions", json=body, timeout=30)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
