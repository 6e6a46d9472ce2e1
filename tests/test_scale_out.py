"""`switchyard up --preprocessors 2`: two preprocessor processes share the HTTP port
(SO_REUSEPORT) and both serve; each reports its own metrics on its own port."""

from __future__ import annotations

import re

import httpx
import openai
from e2e_stack import running_stack

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
