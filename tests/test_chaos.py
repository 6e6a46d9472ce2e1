"""Chaos: processes die mid-stream and every client stream still completes, token for token.

Each test starts the services one by one (so it can kill and restart any of them), runs the
same 32 concurrent streaming requests once fault-free and once with a fault injected, and
compares outputs. The mock engines are deterministic per context, so a migrated request must
produce exactly the fault-free text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from dataclasses import dataclass, field

import httpx
import openai
import pytest
from e2e_stack import LOCAL, Processes, wait_until

from switchyard.common.ports import wildcard_endpoint
from switchyard.common.workers import worker_flag

MODEL = "deepseek-mock"
STREAMS = 32
MAX_TOKENS = 40


@dataclass
class Stack:
    procs: Processes
    base: str
    engines: dict[str, list[str]]  # name -> its command line, on the ports it bound
    dispatcher_metrics: list[int] = field(default_factory=list)  # their /metrics ports

    def restart(self, name: str) -> None:
        self.procs.serve(name, *self.engines[name])

    def busiest_engine(self) -> str:
        """The engine with the most streams in flight, as the router counts them. Faults go
        there: KV routing with learned speeds may leave an engine idle in a second run (its
        predicted TTFT a few ms above the others'), and a fault must hit streams."""
        workers = models_instances(self.base)
        assert workers, "no routable engine"
        busiest = max(workers, key=lambda w: w["in_flight"])
        assert busiest["in_flight"] > 0, workers
        port = busiest["url"].rsplit(":", 1)[1]
        return next(name for name, argv in self.engines.items() if argv[4] == port)


def engine_argv(protocol: str, extra=(), port=0, events=LOCAL, replay=LOCAL) -> list[str]:
    return [
        "mock-engine",
        "--protocol",
        protocol,
        "--port",
        str(port),
        "--itl-ms",
        "25",
        "--ttft-ms",
        "5",
        "--kv-events-endpoint",
        events,
        "--kv-replay-endpoint",
        replay,
        *extra,
    ]


@contextlib.contextmanager
def chaos_stack(
    protocols=("vllm", "sglang", "vllm"),
    dispatchers=1,
    routers=1,
    engine_args=None,
    idle_timeout=3.0,
    preprocessor_args=(),
    dispatcher_args=(),
):
    """`engine_args`: engine index -> extra mock-engine flags (fault injection). Every process
    binds its own ports (port 0) and reports them; restarts reuse them."""
    engine_args = engine_args or {}
    with Processes() as procs:
        engines: dict[str, list[str]] = {}
        workers = []
        started = {
            f"engine-{n}": procs.start_ready(
                f"engine-{n}", *engine_argv(protocol, engine_args.get(n, ()))
            )
            for n, protocol in enumerate(protocols)
        }
        for n, protocol in enumerate(protocols):
            name = f"engine-{n}"
            r = started[name].result()
            # a restart binds the same ports (a named host would make the publisher connect)
            events = wildcard_endpoint(r["kv_events"])
            engines[name] = engine_argv(
                protocol, engine_args.get(n, ()), r["port"], events, r["kv_replay"]
            )
            workers += [
                "--worker",
                worker_flag(
                    f"grpc://127.0.0.1:{r['port']}",
                    kv_events=r["kv_events"],
                    kv_replay=r["kv_replay"],
                ),
            ]
        fleet = procs.serve(
            "fleet",
            "fleet",
            "--control",
            LOCAL,
            "--events",
            LOCAL,
            "--probe-interval",
            "0.5",
            *workers,
        )
        fleet_flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
        router_eps = [
            procs.serve(f"router-{n}", "router", "--bind", LOCAL, *fleet_flags)["bind"]
            for n in range(routers)
        ]
        dispatcher_reports = [
            procs.serve(
                f"dispatcher-{n}", "dispatcher", "--bind", LOCAL, *fleet_flags, *dispatcher_args
            )
            for n in range(dispatchers)
        ]
        dispatcher_eps = [report["bind"] for report in dispatcher_reports]
        pre = [
            "preprocessor",
            "--port",
            "0",
            "--stream-idle-timeout",
            str(idle_timeout),
            "--route-timeout",
            "1",
            *preprocessor_args,
            *fleet_flags,
        ]
        for endpoint in router_eps:
            pre += ["--router", endpoint]
        for endpoint in dispatcher_eps:
            pre += ["--dispatcher", endpoint]
        http = procs.serve("preprocessor", *pre)["port"]
        base = f"http://127.0.0.1:{http}"
        metrics = [r["metrics_port"] for r in dispatcher_reports if r.get("metrics_port")]
        stack = Stack(procs, base, engines, metrics)
        try:
            wait_until(
                lambda: len(models_instances(base)) == len(protocols),
                timeout=60,
                what="every engine routable",
            )
        except AssertionError as exc:
            logs = "\n".join(f"--- {name}\n{procs.log(name)[-1500:]}" for name in procs.procs)
            raise AssertionError(f"{exc}\n{logs}") from None
        yield stack


def models_instances(base: str) -> list[dict]:
    """The workers the router would consider (from a dry-run route)."""
    try:
        reply = httpx.post(base + "/debug/route", json={"model": MODEL, "prompt": "x"}, timeout=5)
    except httpx.HTTPError:
        return []
    return reply.json()["workers"] if reply.status_code == 200 else []


def first_tokens(stack: Stack) -> int:
    """Generations that have had their first token from an engine (the dispatchers' count)."""
    name = "switchyard_dispatcher_engine_time_to_first_token_seconds_count"
    total = 0
    for port in stack.dispatcher_metrics:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        total += sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                     if line.startswith(name + "{"))  # fmt: skip
    return total


def prompt(n: int) -> list[dict]:
    return [{"role": "user", "content": f"Stream number {n}: describe shunting yard {n * 13}."}]


@dataclass
class Outcome:
    text: str
    finish: str | None
    completion_tokens: int


# Every stream's request unless a test asks otherwise: 40 tokens, always.
PLAIN = {"max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}}


async def one_stream(
    client: openai.AsyncOpenAI,
    n: int,
    started: asyncio.Event | None,
    counter: list[int],
    fields: dict | None = None,
) -> Outcome:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=prompt(n),
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **(fields or PLAIN),
    )
    parts, finish, usage = [], None, None
    first = True
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
                if first:
                    first = False
                    counter[0] += 1
                    if started is not None and counter[0] == STREAMS:
                        started.set()
            if choice.finish_reason:
                finish = choice.finish_reason
    return Outcome("".join(parts), finish, usage.completion_tokens if usage else -1)


async def run_streams(
    base: str, fault=None, timeout: float = 120, fields: dict | None = None
) -> list[Outcome]:
    """32 concurrent streams; `fault()` runs once every stream has its first token.
    `fields`: the request's fields beyond model, messages and streaming (default PLAIN)."""
    started = asyncio.Event()
    counter = [0]
    async with openai.AsyncOpenAI(
        base_url=base + "/v1", api_key="none", max_retries=0, timeout=timeout
    ) as client:
        tasks = [
            asyncio.create_task(one_stream(client, n, started, counter, fields))
            for n in range(STREAMS)
        ]
        if fault is not None:
            await asyncio.wait_for(started.wait(), 60)
            await asyncio.to_thread(fault)
        return await asyncio.gather(*tasks)


def check_identical(expected: list[Outcome], got: list[Outcome]) -> None:
    assert len(got) == STREAMS
    for n, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have.text == want.text, f"stream {n} differs after the fault"
        assert have.finish == want.finish == "length"
        assert have.completion_tokens == want.completion_tokens == MAX_TOKENS


def test_engine_killed_mid_stream():
    with chaos_stack() as stack:
        expected = asyncio.run(run_streams(stack.base))
        killed_at = []

        def kill_engine():
            stack.procs.kill(stack.busiest_engine())
            killed_at.append(time.monotonic())

        got = asyncio.run(run_streams(stack.base, fault=kill_engine))
        check_identical(expected, got)
        assert "migrating request_id=" in stack.procs.log("preprocessor")


PERSON = {
    "type": "json_schema",
    "json_schema": {
        "name": "person",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 40, "maxLength": 60},
                "city": {"type": "string", "minLength": 40, "maxLength": 60},
                "age": {"type": "integer"},
            },
            "required": ["name", "city", "age"],
            "additionalProperties": False,
        },
    },
}


def test_structured_output_streams_are_regenerated_not_continued():
    """An engine restarts a grammar with each request: a migrated json_schema stream is
    regenerated from the prompt on the other engine (greedy: the same tokens), and the client
    gets one JSON document, byte for byte the fault-free one, never a second one appended."""
    fields = {"max_tokens": 200, "response_format": PERSON}
    with chaos_stack(protocols=("sglang", "vllm")) as stack:
        expected = asyncio.run(run_streams(stack.base, fields=fields))

        def kill_engine():
            stack.procs.kill(stack.busiest_engine())

        got = asyncio.run(run_streams(stack.base, fault=kill_engine, fields=fields))
        for want, have in zip(expected, got, strict=True):
            person = json.loads(have.text)
            assert set(person) == {"name", "city", "age"}
            assert have == want
        log = stack.procs.log("preprocessor")
        assert re.search(r"migrating request_id=\S+ .* after [1-9]\d* tokens", log), log[-2000:]


def test_sampled_structured_output_starts_over_while_nothing_was_sent():
    """Sampled, a constrained output would not come out the same on another engine; not
    streamed to the client (stop strings make the engine stream it), none of it was sent, so
    the request starts over from the prompt: every answer is one valid document."""
    with chaos_stack(protocols=("sglang", "vllm")) as stack:
        base = stack.base

        async def requests() -> list[str]:
            async with openai.AsyncOpenAI(
                base_url=base + "/v1", api_key="none", max_retries=0, timeout=60
            ) as client:

                async def one(n: int) -> str:
                    reply = await client.chat.completions.create(
                        model=MODEL,
                        messages=prompt(n),
                        max_tokens=200,
                        temperature=1.0,
                        stop=["never in a name"],
                        response_format=PERSON,
                    )
                    return reply.choices[0].message.content or ""

                tasks = [asyncio.create_task(one(n)) for n in range(STREAMS)]

                def in_flight() -> bool:
                    return sum(w["in_flight"] for w in models_instances(base)) == STREAMS

                await asyncio.to_thread(wait_until, in_flight, 30, 0.02, "all in flight")
                # Every output some tokens in (none sent: not streamed), on any machine.
                await asyncio.to_thread(
                    wait_until, lambda: first_tokens(stack) == STREAMS, 30, 0.02, "output begun"
                )
                stack.procs.kill(stack.busiest_engine())
                return await asyncio.gather(*tasks)

        for text in asyncio.run(requests()):
            assert set(json.loads(text)) == {"name", "city", "age"}
        log = stack.procs.log("preprocessor")
        assert "over from the prompt: " in log, log[-2000:]


def test_router_killed_mid_stream():
    with chaos_stack() as stack:
        expected = asyncio.run(run_streams(stack.base))

        def kill_router():
            stack.procs.kill("router-0")

        got = asyncio.run(run_streams(stack.base, fault=kill_router))
        check_identical(expected, got)
        # With no router, new requests are routed locally and still served.
        again = asyncio.run(run_streams(stack.base))
        check_identical(expected, again)
        assert "routing locally" in stack.procs.log("preprocessor")


def test_one_of_two_dispatchers_killed_mid_stream():
    with chaos_stack(dispatchers=2) as stack:
        expected = asyncio.run(run_streams(stack.base))

        def kill_dispatcher():
            stack.procs.kill("dispatcher-0")

        got = asyncio.run(run_streams(stack.base, fault=kill_dispatcher))
        check_identical(expected, got)
        assert "went away" in stack.procs.log("preprocessor")


@pytest.mark.parametrize(
    ("noticed_by", "preprocessor_args", "dispatcher_args"),
    [
        ("gap timeout", ("--stream-gap-timeout", "1"), ("--stall-timeout", "0")),
        ("stall watch", ("--stream-gap-timeout", "30"), ("--stall-timeout", "1")),
    ],
)
def test_frozen_engine_streams_migrate(noticed_by, preprocessor_args, dispatcher_args):
    """Issue 14: a SIGSTOPped engine keeps its connections open, and only the 60 s idle
    timeout noticed. The preprocessor's gap timeout between tokens, or the dispatcher's
    watch of an engine silent on every stream, moves its streams within seconds."""
    with chaos_stack(
        idle_timeout=60, preprocessor_args=preprocessor_args, dispatcher_args=dispatcher_args
    ) as stack:
        expected = asyncio.run(run_streams(stack.base))

        frozen: list[str] = []

        def freeze_engine():
            frozen.append(stack.busiest_engine())
            stack.procs.signal(frozen[0], signal.SIGSTOP)

        try:
            got = asyncio.run(run_streams(stack.base, fault=freeze_engine, timeout=30))
        finally:
            for name in frozen:
                stack.procs.signal(name, signal.SIGCONT)
        check_identical(expected, got)
        if noticed_by == "gap timeout":
            assert "no reply for 1s" in stack.procs.log("preprocessor")
        else:
            assert "stalled: the engine produced nothing for 1s" in stack.procs.log("dispatcher-0")


def test_restarted_engine_is_readmitted_with_a_fresh_index():
    with chaos_stack(protocols=("vllm",)) as stack:
        long = [
            {"role": "user", "content": " ".join(f"Wagon {n} to track {n}." for n in range(30))}
        ]
        body = {"model": MODEL, "messages": long, "max_tokens": 4, "temperature": 0}
        first = httpx.post(stack.base + "/v1/chat/completions", json=body, timeout=30).json()
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        stack.procs.kill("engine-0")
        wait_until(lambda: models_instances(stack.base) == [], what="the dead engine removed")
        stack.restart("engine-0")
        wait_until(
            lambda: len(models_instances(stack.base)) == 1,
            timeout=30,
            what="the restarted engine re-admitted",
        )
        # The new engine's cache is empty, and so is the router's view of it.
        route = httpx.post(stack.base + "/debug/route", json=body, timeout=5).json()
        assert route["workers"][0]["overlap_blocks"] == 0
        again = httpx.post(stack.base + "/v1/chat/completions", json=body, timeout=30).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert (
            again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        )
        # ... and it learns the new engine's cache from the restarted event stream.
        wait_until(
            lambda: (
                httpx.post(stack.base + "/debug/route", json=body, timeout=5).json()["workers"][0][
                    "overlap_blocks"
                ]
                > 0
            ),
            what="index rebuilt",
        )


def fault_free_outputs() -> list[Outcome]:
    with chaos_stack(protocols=("vllm",)) as stack:
        return asyncio.run(run_streams(stack.base))


def test_hung_engine_streams_migrate_after_the_gap_timeout():
    """An engine that stops sending mid-stream: the gap timeout (between tokens), not the
    first-token idle timeout, moves its streams."""
    expected = fault_free_outputs()
    with chaos_stack(
        engine_args={0: ["--hang-after-tokens", "5"]},
        idle_timeout=30,
        preprocessor_args=("--stream-gap-timeout", "1"),
    ) as stack:
        got = asyncio.run(run_streams(stack.base))
        check_identical(expected, got)
        log = stack.procs.log("preprocessor")
        assert "kind=disconnected after 5 tokens: no reply for 1s" in log


def test_overloaded_engine_is_avoided():
    expected = fault_free_outputs()
    with chaos_stack(engine_args={1: ["--fail-overloaded", "1"]}) as stack:
        got = asyncio.run(run_streams(stack.base))
        check_identical(expected, got)
        assert "kind=overloaded" in stack.procs.log("preprocessor")


async def whole_requests(base: str, fault=None, timeout: float = 120) -> list[Outcome]:
    """The same 32 requests, not streamed: the engines answer each with one final message.
    `fault()` runs once the router counts all of them in flight (no token shows before)."""
    async with openai.AsyncOpenAI(
        base_url=base + "/v1", api_key="none", max_retries=0, timeout=timeout
    ) as client:

        async def one(n: int) -> Outcome:
            reply = await client.chat.completions.create(
                model=MODEL,
                messages=prompt(n),
                max_tokens=MAX_TOKENS,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            choice = reply.choices[0]
            usage = reply.usage
            return Outcome(
                choice.message.content or "",
                choice.finish_reason,
                usage.completion_tokens if usage else -1,
            )

        tasks = [asyncio.create_task(one(n)) for n in range(STREAMS)]
        if fault is not None:

            def in_flight() -> bool:
                return sum(w["in_flight"] for w in models_instances(base)) == STREAMS

            await asyncio.to_thread(wait_until, in_flight, 30, 0.02, "every request in flight")
            await asyncio.to_thread(fault)
        return await asyncio.gather(*tasks)


def test_whole_requests_survive_a_killed_and_a_frozen_engine():
    """Requests the client does not stream go to the engine whole (stream off): a killed
    engine's requests restart from the prompt elsewhere, a frozen one's once the HTTP/2
    keepalive gives up on it (its 12 + 4 s; the gap timeout does not watch whole requests).
    The answers are the streamed ones, byte for byte."""
    with chaos_stack(dispatcher_args=("--stall-timeout", "1")) as stack:
        expected = asyncio.run(run_streams(stack.base))
        check_identical(expected, asyncio.run(whole_requests(stack.base)))

        def kill_engine():
            stack.procs.kill(stack.busiest_engine())

        check_identical(expected, asyncio.run(whole_requests(stack.base, fault=kill_engine)))
        assert "after 0 tokens" in stack.procs.log("preprocessor")  # restarted from the prompt

        frozen: list[str] = []

        def freeze_engine():
            frozen.append(stack.busiest_engine())
            stack.procs.signal(frozen[0], signal.SIGSTOP)

        try:
            got = asyncio.run(whole_requests(stack.base, fault=freeze_engine, timeout=60))
        finally:
            for name in frozen:
                stack.procs.signal(name, signal.SIGCONT)
        check_identical(expected, got)
        assert "keepalive ping not acknowledged" in stack.procs.log("preprocessor")


def test_a_whole_request_an_engine_stalls_migrates():
    """An engine that stops one request mid-way (serving the others): a whole request is
    silent by design, so no gap shows; past the longest a streamed attempt could take
    (first-token timeout 1 s + 40 tokens x gap timeout 0.1 s) it migrates, and the answer is
    the fault-free one."""
    expected = fault_free_outputs()
    with chaos_stack(
        engine_args={0: ["--hang-after-tokens", "5"]},
        preprocessor_args=("--stream-idle-timeout", "1", "--stream-gap-timeout", "0.1"),
    ) as stack:
        got = asyncio.run(whole_requests(stack.base, timeout=60))
        check_identical(expected, got)
        log = stack.procs.log("preprocessor")
        assert "no reply for 5s to a whole request of at most 40 tokens" in log


def test_a_frozen_dispatcher_is_left_for_the_other():
    """A SIGSTOPped dispatcher keeps its TCP connections open, and whole requests are silent
    until done, so no stream timeout watches them: the preprocessor's ZMQ heartbeat drops
    the connection (4 s without an answer), and its requests go through the other one."""
    with chaos_stack(dispatchers=2) as stack:
        expected = asyncio.run(run_streams(stack.base))
        frozen: list[str] = []

        def freeze_dispatcher():
            frozen.append("dispatcher-0")
            stack.procs.signal("dispatcher-0", signal.SIGSTOP)

        try:
            got = asyncio.run(whole_requests(stack.base, fault=freeze_dispatcher, timeout=60))
        finally:
            for name in frozen:
                stack.procs.signal(name, signal.SIGCONT)
        check_identical(expected, got)
        log = stack.procs.log("preprocessor")
        assert "lost connection to" in log and "went away" in log


def test_a_restarted_engine_gets_its_share_of_sticky_sessions():
    """Regression: under steady load from 8 sessions (the OpenAI `user` field), every session
    moved to the surviving engine while engine-0 was down and stayed there after it came back
    (the overload guard of session affinity could never fire with two workers): the
    restarted engine served nothing. Now sessions move to it within seconds."""
    with chaos_stack(protocols=("vllm", "sglang")) as stack:
        port = stack.engines["engine-0"][4]
        stop = asyncio.Event()

        async def session(client: openai.AsyncOpenAI, n: int) -> None:
            while not stop.is_set():
                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=prompt(n),
                    max_tokens=16,
                    temperature=0,
                    stream=True,
                    user=f"client-{n}",
                    extra_body={"ignore_eos": True},
                )
                async for _ in stream:
                    pass

        def restart_and_watch() -> int:
            time.sleep(1)
            stack.procs.kill("engine-0")
            wait_until(lambda: len(models_instances(stack.base)) == 1, what="engine-0 removed")
            time.sleep(1)  # every session moves to engine-1
            stack.restart("engine-0")
            wait_until(lambda: len(models_instances(stack.base)) == 2, what="engine-0 back")
            start = len(stack.procs.log("preprocessor"))

            def served() -> int:
                log = stack.procs.log("preprocessor")[start:]
                return log.count(f"worker=grpc://127.0.0.1:{port} ")

            # Sessions move back within seconds (a count, not a time window: machine speed
            # sets how many requests fit in one).
            return int(wait_until(lambda: served() >= 10 and served(), timeout=60,
                                  what="sessions back on engine-0"))  # fmt: skip

        async def run() -> int:
            async with openai.AsyncOpenAI(
                base_url=stack.base + "/v1", api_key="none", max_retries=0, timeout=30
            ) as client:
                load = [asyncio.create_task(session(client, n)) for n in range(8)]
                try:
                    return await asyncio.to_thread(restart_and_watch)
                finally:
                    stop.set()
                    await asyncio.gather(*load)

        served = asyncio.run(run())
        # 8 sessions of ~0.4 s requests: an even share is ~30 in 3 s; none before the fix.
        assert served >= 10, served
