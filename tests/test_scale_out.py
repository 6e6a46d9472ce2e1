"""`switchyard up --preprocessors 2`: two preprocessor processes share the HTTP port (a
listening socket each, of one SO_REUSEPORT group `up` holds) and both serve; each reports its
own metrics on its own port; a dead one's queue is served by the other."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import httpx
import openai
from e2e_stack import running_stack, wait_until

MODEL = "deepseek-mock"


def served(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=10).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("switchyard_preprocessor_requests_total{") and 'status="200"' in line
    )


def test_two_preprocessors_share_the_port():
    with running_stack("--mock-engines", "sglang", "--preprocessors", "2", "--metrics") as stack:
        ports = dict(re.findall(r"(preprocessor-\d) metrics on (http://\S+/metrics)", stack.log()))
        assert set(ports) == {"preprocessor-0", "preprocessor-1"}, stack.log()[-2000:]
        requests = 24
        for n in range(requests):
            # A client per request: a new connection each time, for the kernel to spread.
            with openai.OpenAI(
                base_url=stack.base_url + "/v1", api_key="none", max_retries=0
            ) as client:
                reply = client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"question {n}"}],
                    max_tokens=3,
                    extra_body={"ignore_eos": True},
                )
                assert reply.usage.completion_tokens == 3
        counts = {name: served(url) for name, url in ports.items()}
        assert sum(counts.values()) == requests, counts
        # 24 connections all hashed to one listener: about 1 in 8 million.
        assert all(count > 0 for count in counts.values()), counts


def taken_over(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=10).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("switchyard_preprocessor_connections_taken_over_total")
    )


async def burst(base: str, count: int) -> list[str]:
    """`count` requests at once, each on a new connection: the errors ('' for a success)."""

    async def one(n: int) -> str:
        messages = [{"role": "user", "content": f"q {n}"}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 2}
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                reply = await client.post(base + "/v1/chat/completions", json=body)
            return "" if reply.status_code == 200 else f"HTTP {reply.status_code}: {reply.text}"
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"

    return await asyncio.gather(*(one(n) for n in range(count)))


def test_a_dead_preprocessor_loses_no_queued_connection():
    """Regression (issue 38): each preprocessor had its own SO_REUSEPORT listener, and a
    SIGKILL reset the connections the kernel had queued for it (7 of 308 requests under
    load; half of a burst sent while it was frozen). Now `up` holds every listener and the
    siblings take over what waits in a frozen or dead one's queue: preprocessor-0 is frozen
    (it accepts nothing), a burst arrives, it is killed, and every request is served."""
    with running_stack("--mock-engines", "sglang", "--preprocessors", "2") as stack:
        children = stack.report()["children"]
        metrics = {
            name: f"http://127.0.0.1:{children[name]['metrics_port']}/metrics"
            for name in ("preprocessor-0", "preprocessor-1")
        }
        victim = stack.pid("preprocessor-0")

        async def freeze_burst_kill() -> list[str]:
            os.kill(victim, signal.SIGSTOP)
            try:
                requests = asyncio.create_task(burst(stack.base_url, 32))
                await asyncio.sleep(1.0)
            finally:
                os.kill(victim, signal.SIGKILL)
            return await requests

        errors = asyncio.run(freeze_burst_kill())
        assert [e for e in errors if e] == []
        assert taken_over(metrics["preprocessor-1"]) > 0
        # The restart inherits the same socket and serves its share again.
        wait_until(lambda: stack.pid("preprocessor-0") != victim, 60, what="the restart")

        def restart_serves() -> bool:
            assert not any(asyncio.run(burst(stack.base_url, 8)))
            try:
                return served(metrics["preprocessor-0"]) > 0
            except httpx.HTTPError:  # not serving its metrics yet
                return False

        wait_until(restart_serves, 60, 0.5, "the restarted preprocessor serving")
