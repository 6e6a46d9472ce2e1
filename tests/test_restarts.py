"""Restarts under `switchyard up` that must not cut streams or hide models (issue 14).

- The only dispatcher SIGKILLed mid-stream: `up` restarts it (backoff + start-up); every
  stream waits for it and resumes through migration, with exactly the undisturbed text.
- Fleet SIGKILLed: the restarted fleet holds its (still empty) snapshot until its first probe
  round, so no request ever sees the model vanish (404 model_not_found).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
from e2e_stack import running_stack
from test_chaos import check_identical, run_streams

SLOW = ("--mock-speedup", "1", "--mock-itl-ms", "25", "--mock-ttft-ms", "5")


def test_the_only_dispatcher_restarting_does_not_cut_streams():
    with running_stack("--mock-engines", "sglang,vllm", *SLOW) as stack:
        expected = asyncio.run(run_streams(stack.base_url))
        old = stack.pid("dispatcher-0")

        def kill_dispatcher():
            os.kill(old, signal.SIGKILL)

        got = asyncio.run(run_streams(stack.base_url, fault=kill_dispatcher))
        check_identical(expected, got)
        assert stack.pid("dispatcher-0") != old  # it was restarted, not replaced
        assert "went away" in stack.log()


def ports_of(report: dict) -> list[int]:
    """Every port a child of `up` reported it bound."""
    found = []
    for child in report["children"].values():
        for value in child.values():
            if isinstance(value, int) and value:
                found.append(value)
            elif isinstance(value, str) and value.startswith("tcp://"):
                found.append(int(value.rsplit(":", 1)[1]))
    return found


def test_a_restarted_fleet_never_hides_the_model():
    with running_stack("--mock-engines", "sglang,vllm", "--port-range", "20000-29999") as stack:
        # --port-range confines every port the children chose.
        assert all(20000 <= port <= 29999 for port in ports_of(stack.report()))
        body = {"model": "deepseek-mock", "prompt": "Shunt wagon", "max_tokens": 2}
        statuses: list[int] = []
        old = stack.pid("fleet")
        with httpx.Client(base_url=stack.base_url, timeout=30) as http:

            def request() -> None:
                statuses.append(http.post("/v1/completions", json=body).status_code)

            for _ in range(10):
                request()
            os.kill(old, signal.SIGKILL)
            # Through the restart, and a while after it (the new fleet's first snapshot).
            give_up, after = time.monotonic() + 60, None
            while after is None or time.monotonic() < after:
                request()
                if after is None and stack.pid("fleet") != old:
                    after = time.monotonic() + 4
                assert time.monotonic() < give_up, "fleet was not restarted"
        assert set(statuses) == {200}, statuses
