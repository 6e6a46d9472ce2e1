"""A router name and a dispatcher name with several addresses, as `docker compose --scale`
and Kubernetes headless Services make them, end to end with real processes: routers and
dispatchers bound on 127.0.0.2, .3 (and later .4), one port per service, and a preprocessor
given only the two names, which resolve through its production resolver (getaddrinfo, fed by
nss_wrapper from this test's hosts file: support.hosts). Every address takes requests; an
address added to a name is picked up; one removed while streams run on it takes no new
request, lets those streams finish there untouched, and is then closed."""

from __future__ import annotations

import asyncio

import httpx
import openai
from e2e_stack import LOCAL, Processes, http_status, wait_until
from support.hosts import HostsFile

MODEL = "deepseek-mock"
ROUTERS, DISPATCHERS = "routers.switchyard.test", "dispatchers.switchyard.test"
FIRST, SECOND, LATER = "127.0.0.2", "127.0.0.3", "127.0.0.4"
LONG = 150  # tokens of a stream that runs while its dispatcher leaves the name (~6 s)


def metric(url: str, name: str) -> float:
    """The sum of a metric's samples (every label set)."""
    text = httpx.get(url, timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


def upstreams(base: str) -> dict[tuple[str, str], int]:
    """The preprocessor's switchyard_preprocessor_upstreams: (service, state) -> count."""
    found: dict[tuple[str, str], int] = {}
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith("switchyard_preprocessor_upstreams{"):
            labels, value = line.rsplit(" ", 1)
            parts = dict(p.split("=") for p in labels[labels.index("{") + 1 : -1].split(","))
            found[(parts["service"].strip('"'), parts["state"].strip('"'))] = int(float(value))
    return found


def chats(base: str, count: int) -> None:
    with openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60) as api:
        for n in range(count):
            reply = api.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"question {n}"}],
                max_tokens=2,
                extra_body={"ignore_eos": True},
            )
            assert reply.usage is not None and reply.usage.completion_tokens == 2


async def long_stream(base: str, n: int) -> tuple[int, str | None]:
    """(content chunks, finish reason) of a stream of LONG tokens."""
    async with openai.AsyncOpenAI(
        base_url=base + "/v1", api_key="none", max_retries=0, timeout=120
    ) as api:
        stream = await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"a long story {n}"}],
            max_tokens=LONG,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks, finish = 0, None
        async for chunk in stream:
            for choice in chunk.choices:
                chunks += bool(choice.delta.content)
                finish = choice.finish_reason or finish
        return chunks, finish


def test_every_address_of_a_name_takes_requests_as_the_name_changes(tmp_path):
    hosts = HostsFile(tmp_path / "hosts")
    hosts.set(ROUTERS, FIRST, SECOND)
    hosts.set(DISPATCHERS, FIRST, SECOND)
    with Processes() as procs:
        engine = procs.serve(
            "engine", "mock-engine", "--protocol", "sglang", "--port", "0",
            "--itl-ms", "40", "--ttft-ms", "5",
        )  # fmt: skip
        fleet = procs.serve(
            "fleet", "fleet", "--control", LOCAL, "--events", LOCAL,
            "--worker", f"grpc://127.0.0.1:{engine['port']}",
        )  # fmt: skip
        flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
        ports: dict[str, str] = {}  # service -> the port every replica binds
        metrics: dict[tuple[str, str], str] = {}  # (service, address) -> its /metrics URL

        def start(service: str, address: str) -> None:
            # The first replica binds a free port; the others bind it on their address.
            bind = f"tcp://{address}:{ports.get(service, '0')}"
            report = procs.serve(
                f"{service}-{address}", service, "--bind", bind, "--metrics-port", "0", *flags
            )
            ports[service] = report["bind"].rsplit(":", 1)[1]
            metrics[service, address] = f"http://127.0.0.1:{report['metrics_port']}/metrics"

        for address in (FIRST, SECOND):
            start("router", address)
            start("dispatcher", address)
        port = procs.serve(
            "preprocessor", "preprocessor", "--port", "0", *flags,
            "--router", f"tcp://{ROUTERS}:{ports['router']}",
            "--dispatcher", f"tcp://{DISPATCHERS}:{ports['dispatcher']}",
            "--resolve-interval", "0.5",
            env=hosts.env,
        )["port"]  # fmt: skip
        base = f"http://127.0.0.1:{port}"

        def decisions(address: str) -> float:
            return metric(metrics["router", address], "switchyard_router_decisions_total")

        def generations(address: str) -> float:
            return metric(metrics["dispatcher", address], "switchyard_dispatcher_generations_total")

        def connected(count: int, retired: int = 0) -> bool:
            now = upstreams(base)
            return all(
                now.get((service, "connected")) == count
                and now.get((service, "retired")) == retired
                for service in ("router", "dispatcher")
            )

        wait_until(lambda: http_status(base + "/ready") == 200, timeout=60, what="/ready")
        wait_until(lambda: connected(2), timeout=30, what="two routers and two dispatchers")

        # Both addresses of each name take requests (in turn).
        chats(base, 8)
        for address in (FIRST, SECOND):
            assert decisions(address) > 0, address
            assert generations(address) > 0, address

        # An address added to both names is picked up.
        start("router", LATER)
        start("dispatcher", LATER)
        hosts.set(ROUTERS, FIRST, SECOND, LATER)
        hosts.set(DISPATCHERS, FIRST, SECOND, LATER)
        wait_until(lambda: connected(3), timeout=30, what="the third replicas connected")
        chats(base, 6)
        assert decisions(LATER) > 0 and generations(LATER) > 0

        # FIRST leaves both names while long streams run on it: it takes nothing new, its
        # streams finish there (no migration), then it is closed.
        async def remove_under_streams() -> list[tuple[int, str | None]]:
            streams = [asyncio.create_task(long_stream(base, n)) for n in range(6)]
            in_flight = metrics["dispatcher", FIRST]
            await asyncio.to_thread(
                wait_until,
                lambda: metric(in_flight, "switchyard_dispatcher_in_flight") > 0,
                30,
                0.05,
                "streams running on the first dispatcher",
            )
            hosts.set(ROUTERS, SECOND, LATER)
            hosts.set(DISPATCHERS, SECOND, LATER)
            await asyncio.to_thread(
                wait_until,
                lambda: upstreams(base).get(("dispatcher", "retired")) == 1,
                30,
                0.05,
                "the first dispatcher retired",
            )
            assert not all(s.done() for s in streams), "the streams ended before the change"
            return await asyncio.gather(*streams)

        assert asyncio.run(remove_under_streams()) == [(LONG, "length")] * 6
        assert metric(base + "/metrics", "switchyard_preprocessor_migrations_total") == 0
        wait_until(lambda: connected(2), timeout=30, what="the first replicas closed")
        after_streams = decisions(FIRST), generations(FIRST)
        chats(base, 6)
        assert (decisions(FIRST), generations(FIRST)) == after_streams
        log = procs.log("preprocessor")
        for service, service_port in ports.items():
            assert f"{service} tcp://{FIRST}:{service_port} retired" in log
            assert f"{service} tcp://{FIRST}:{service_port} closed" in log
