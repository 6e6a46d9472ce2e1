"""Fleet's state across a restart, end to end under `switchyard up` (issue 38): a worker added
and one drained through the admin API are still there after fleet is SIGKILLed and restarted,
the restarted fleet serves the instance set it stored at once, no request fails meanwhile,
and `up`'s log names the engines it actually serves as they change."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import openai
import pytest
from e2e_stack import LOCAL, Processes, messages, running_stack, wait_until

MODEL = "deepseek-mock"


def admin(base: str, method: str, path: str = "", body=None) -> httpx.Response:
    return httpx.request(method, f"{base}/admin/workers{path}", json=body, timeout=30)


def workers(base: str) -> dict[str, dict]:
    try:
        reply = admin(base, "GET")
    except httpx.HTTPError:
        return {}
    return {w["url"]: w for w in reply.json()["data"]} if reply.status_code == 200 else {}


async def steady(base: str, stop: asyncio.Event) -> list[str]:
    """Four clients asking back to back until `stop`; every failure's error."""
    errors: list[str] = []

    async def client(n: int) -> None:
        async with openai.AsyncOpenAI(
            base_url=base + "/v1", api_key="none", max_retries=0, timeout=60
        ) as api:
            while not stop.is_set():
                try:
                    reply = await api.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"client {n}"}],
                        max_tokens=8,
                        extra_body={"ignore_eos": True},
                    )
                    assert reply.usage is not None and reply.usage.completion_tokens == 8
                except (openai.APIError, AssertionError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(client(n) for n in range(4)))
    return errors


def test_admin_changes_survive_a_fleet_restart(tmp_path):
    with Processes() as procs:
        extra = procs.serve(
            "extra-engine", "mock-engine", "--protocol", "vllm", "--port", "0",
            "--kv-events-endpoint", LOCAL, "--kv-replay-endpoint", LOCAL,
        )  # fmt: skip
        extra_url = f"grpc://127.0.0.1:{extra['port']}"
        with running_stack(
            "--mock-engines", "sglang,vllm", "--state-dir", str(tmp_path)
        ) as stack:
            base = stack.base_url
            flagged = sorted(workers(base))
            added = admin(base, "POST", body={"url": extra_url, "model": MODEL})
            assert added.status_code == 201, added.text
            wait_until(
                lambda: workers(base).get(extra_url, {}).get("state") == "ready",
                60,
                what="the added engine ready",
            )
            drained = workers(base)[flagged[0]]["instance_id"]
            assert admin(base, "POST", f"/{drained}/drain").status_code == 200
            wait_until(
                lambda: f"+{extra_url}" in stack.log() and "engines changed" in stack.log(),
                30,
                what="up's log naming the added engine",
            )
            victim = stack.pid("fleet")

            async def kill_fleet_under_load() -> list[str]:
                stop = asyncio.Event()
                load = asyncio.create_task(steady(base, stop))
                await asyncio.sleep(1.0)
                os.kill(victim, signal.SIGKILL)
                await asyncio.to_thread(
                    wait_until, lambda: stack.pid("fleet") != victim, 60, 0.1, "fleet restarted"
                )
                await asyncio.to_thread(
                    wait_until,
                    lambda: "restored 3 instance(s) from the state file" in stack.log(),
                    60,
                    0.1,
                    "the restarted fleet restoring its set",
                )
                await asyncio.sleep(2.0)  # it re-probes the restored set meanwhile
                stop.set()
                return await load

            assert asyncio.run(kill_fleet_under_load()) == []
            after = workers(base)
            assert after[extra_url]["source"] == "admin"
            assert after[extra_url]["state"] == "ready"
            assert after[flagged[0]]["state"] == "draining"
            assert after[flagged[1]]["state"] == "ready"
            log = messages(stack.log())
            serving = [line for line in log if "is serving the OpenAI API" in line]
            assert len(serving) == 1 and all(url in serving[0] for url in flagged)


class TestFleetArg:
    """`up --fleet-arg` reaches fleet after `up`'s own flags, so the operator's value wins."""

    def test_it_overrides_ups_own_flags(self, tmp_path):
        elsewhere = tmp_path / "elsewhere" / "fleet.sqlite"
        elsewhere.parent.mkdir()
        with running_stack(
            "--mock-engines", "vllm", "--state-dir", str(tmp_path),
            f"--fleet-arg=--state-file={elsewhere}",
        ):  # fmt: skip
            wait_until(elsewhere.exists, 60, what="fleet's state in the file it was given")
        assert not (tmp_path / "fleet-state.sqlite").exists()

    def test_a_bad_one_stops_up_naming_it(self):
        with pytest.raises(RuntimeError, match="argument --down-after: must be at least 1"):
            with running_stack("--mock-engines", "vllm", "--fleet-arg=--down-after=0"):
                pass
