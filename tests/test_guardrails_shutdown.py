"""Graceful shutdown. SIGTERM to `switchyard up` with 32 live streams: the preprocessor stops
accepting, every stream finishes whole, and only then do the dispatchers, routers, fleet and
engines stop (regression: every child got SIGTERM at once and streams were cut with "no
dispatcher is reachable"). SIGTERM to a preprocessor whose streams outlast --shutdown-grace:
they end with an error event, not a cut connection, and their engine requests are aborted.
SIGTERM to a service still waiting for fleet: it stops at once."""

from __future__ import annotations

import asyncio
import signal

import httpx
import openai
import pytest
from e2e_stack import LOCAL, Processes, running_stack, wait_until

from switchyard.common.engines import connect
from switchyard.common.ports import free_port

MODEL = "deepseek-mock"
STREAMS = 32


async def stream_all(base: str, tokens: int, on_started) -> list:  # type: ignore[no-untyped-def]
    started, all_started = [0], asyncio.Event()

    async def one(client, n: int):  # type: ignore[no-untyped-def]
        stream = await client.completions.create(
            model=MODEL,
            prompt=f"stream {n} of the shutdown",
            max_tokens=tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, finish, usage, first = "", None, None, True
        try:
            async for chunk in stream:
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    text += choice.text
                    finish = choice.finish_reason or finish
                    if first and choice.text:
                        first = False
                        started[0] += 1
                        if started[0] == STREAMS:
                            all_started.set()
        except openai.APIError as exc:  # an error event in the stream
            return ("error", str(exc), text)
        return (finish, usage.completion_tokens if usage else -1, text)

    async with openai.AsyncOpenAI(
        base_url=base + "/v1", api_key="none", max_retries=0, timeout=120
    ) as client:
        tasks = [asyncio.create_task(one(client, n)) for n in range(STREAMS)]
        await asyncio.wait_for(all_started.wait(), 60)
        await asyncio.to_thread(on_started)
        return await asyncio.gather(*tasks)


class TestShutdown:
    def test_sigterm_to_up_lets_32_live_streams_finish(self):
        # 25 ms a token (100 / --mock-speedup 4): each stream runs for several seconds.
        with running_stack("--mock-engines", "sglang,vllm", "--mock-itl-ms", "100") as stack:
            results = asyncio.run(
                stream_all(stack.base_url, 150, lambda: stack.proc.send_signal(signal.SIGTERM))
            )
            assert stack.proc.wait(timeout=90) == 0
            log = stack.log()
        assert [r[:2] for r in results] == [("length", 150)] * STREAMS, [
            r[:2] for r in results if r[:2] != ("length", 150)
        ]
        assert "no dispatcher is reachable" not in log
        # The ingress stopped first, then the rest.
        assert log.index("preprocessor INFO switchyard.preprocessor.serving: stopping") < log.index(
            "fleet stopping"
        )

    def test_streams_past_the_preprocessors_grace_end_cleanly(self):
        with Processes() as procs:
            engine = procs.serve(
                "engine", "mock-engine", "--protocol", "vllm", "--port", "0", "--itl-ms", "50",
            )  # fmt: skip
            url = f"grpc://127.0.0.1:{engine['port']}"
            fleet = procs.serve(
                "fleet", "fleet", "--control", LOCAL, "--events", LOCAL, "--worker", url
            )
            flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
            router = procs.serve("router", "router", "--bind", LOCAL, *flags)["bind"]
            dispatcher = procs.serve("dispatcher", "dispatcher", "--bind", LOCAL, *flags)["bind"]
            port = procs.serve(
                "preprocessor", "preprocessor", "--port", "0", *flags, "--router", router,
                "--dispatcher", dispatcher, "--shutdown-grace", "1",
            )["port"]  # fmt: skip
            base = f"http://127.0.0.1:{port}"
            wait_until(
                lambda: httpx.get(base + "/ready", timeout=2).status_code == 200,
                timeout=60,
                what="ready",
            )
            results = asyncio.run(
                stream_all(base, 2000, lambda: procs.signal("preprocessor", signal.SIGTERM))
            )
            # uvicorn re-raises the SIGTERM it handled once it is done: a clean stop.
            assert procs.procs["preprocessor"].wait(timeout=60) in (0, -signal.SIGTERM)
            for kind, message, text in results:
                assert kind == "error" and "shut down" in message and text

            async def running() -> int:
                client = await connect(url)
                try:
                    return (await client.load(timeout=2)).running
                finally:
                    await client.close()

            wait_until(lambda: asyncio.run(running()) == 0, timeout=20, what="engine aborts")
            try:
                httpx.get(base + "/health", timeout=2)
                raise AssertionError("the stopped preprocessor still answers")
            except httpx.HTTPError:
                pass
            assert procs.procs["dispatcher"].poll() is None  # only the preprocessor stopped


@pytest.mark.parametrize(
    "service", [["router", "--bind", LOCAL], ["dispatcher", "--bind", LOCAL], ["preprocessor"]]
)
def test_sigterm_while_fleet_never_answers_stops_at_once(service):
    """Regression: a service whose fleet did not answer yet waited in the first sync and let
    SIGTERM go unheard, until the supervisor (or Kubernetes) killed it."""
    name, *args = service
    if name == "preprocessor":
        args = ["--port", "0"]
    nobody = f"tcp://127.0.0.1:{free_port()}"
    with Processes() as procs:
        procs.serve(name, name, *args, "--fleet-control", nobody, "--fleet-events", nobody)
        wait_until(
            lambda: "waiting for fleet's first snapshot" in procs.log(name),
            timeout=30,
            what="the wait for fleet",
        )
        procs.signal(name, signal.SIGTERM)
        # uvicorn re-raises the SIGTERM it handled once it is done: a clean stop.
        assert procs.procs[name].wait(timeout=20) in (0, -signal.SIGTERM)
        assert "stopped before fleet answered" in procs.log(name)
