"""Disaggregated prefill/decode end to end: real mock engines in prefill and decode roles.

For each protocol, 1 prefill + 2 decode engines: chat outputs match an aggregated run of the
same prompts token for token, every prompt's KV is handed over by the prefill engine and
received by a decode engine (their INFO log lines), and a killed prefill engine ends every
request cleanly (a fallback or an HTTP error) within a bounded time, never a hung stream.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2e_stack import LOCAL, Processes, Ready, running_stack, wait_until

from switchyard.common.instance_id import instance_id

MODEL = "deepseek-mock"
PROMPTS = [
    "Describe a shunting yard in one paragraph.",
    "What does a railway switch do?",
    "List three kinds of freight cars and why they exist.",
]
MAX_TOKENS = 24


def body(content: str) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }


def chat(base: str, content: str, timeout: float = 30.0) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", json=body(content), timeout=timeout)


def text_of(reply: httpx.Response) -> str:
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def aggregated_texts() -> dict[str, str]:
    """The same prompts through one plain (aggregated) engine."""
    with running_stack("--mock-engines", "sglang") as stack:
        return {p: text_of(chat(stack.base_url, p)) for p in PROMPTS}


@dataclass
class DisaggStack:
    procs: Processes
    base: str
    engines: list[str]  # process names: the prefill engine first

    def dry_route(self) -> dict:
        try:
            reply = httpx.post(self.base + "/debug/route", json={"model": MODEL, "prompt": "x"})
        except httpx.HTTPError:
            return {}
        return reply.json() if reply.status_code == 200 else {}


@contextlib.contextmanager
def disagg_stack(
    protocol: str,
    engine_args: list[list[str]],
    listed_prefill: tuple[int, ...] = (),
    idle_timeout: float = 5.0,
    first_picked: bool = False,
) -> Iterator[DisaggStack]:
    """Engines in order (the first is the prefill one); `listed_prefill`: indexes given to
    fleet's --prefill; `first_picked`: the first prefill hop goes to engine 0. The prefill
    picker is then round robin, whose turns follow instance ids (equal costs tie at random
    otherwise), and engine 0 gets a lower instance id than engine 1, by restarting engine 1
    on another port until so."""
    with Processes() as procs, tempfile.TemporaryDirectory() as tmp:

        def engine(n: int, name: str = "") -> Ready:
            return procs.start_ready(
                name or f"engine-{n}", "mock-engine", "--protocol", protocol, "--port", "0",
                "--ttft-ms", "5", "--itl-ms", "2", "--bootstrap-timeout", "5", *engine_args[n],
            )  # fmt: skip

        def url(ready: Ready) -> str:
            return f"grpc://127.0.0.1:{ready.result()['port']}"

        names = [f"engine-{n}" for n in range(len(engine_args))]
        starting = [engine(n) for n in range(len(engine_args))]
        # Spares for engine 1, started at once: one of them likely has a higher instance id
        # than engine 0 (each does with probability 1/2), so restarts are rare.
        spares = [engine(1, f"engine-1-spare-{k}") for k in range(2)] if first_picked else []
        urls = [url(r) for r in starting]
        candidates = [(urls[1], names[1])] + [(url(r), r.name) for r in spares]
        draws = 0
        while first_picked:
            above = [(u, n) for u, n in candidates if instance_id(u) > instance_id(urls[0])]
            if above:
                urls[1], names[1] = above[0]
                for _, name in candidates:
                    if name != names[1]:
                        procs.kill(name)
                break
            draws += 1
            assert draws < 20, "no engine 1 with an instance id above engine 0's in 20 draws"
            # Engine 0 is drawn again too: an id near the top of the range has few above it,
            # so restarting engine 1 alone could take hundreds of tries.
            for name in [names[0]] + [name for _, name in candidates]:
                procs.kill(name)
            fresh = [engine(0), engine(1)]
            urls[0] = url(fresh[0])
            candidates = [(url(fresh[1]), fresh[1].name)]
        workers: list[str] = []
        for n, url in enumerate(urls):
            workers += ["--worker", url]
            if n in listed_prefill:
                workers += ["--prefill", url]
        fleet = procs.serve(
            "fleet", "fleet", "--control", LOCAL, "--events", LOCAL, "--probe-interval", "0.5",
            *workers,
        )  # fmt: skip
        fleet_flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
        routing: list[str] = []
        if first_picked:
            config = Path(tmp) / "routing.json"
            config.write_text(json.dumps({"prefill": {"picker": "round_robin"}}))
            routing = ["--routing-config", str(config)]
        router = procs.serve("router", "router", "--bind", LOCAL, *fleet_flags, *routing)["bind"]
        dispatcher = procs.serve("dispatcher", "dispatcher", "--bind", LOCAL, *fleet_flags)["bind"]
        http = procs.serve(
            "preprocessor", "preprocessor", "--port", "0",
            "--stream-idle-timeout", str(idle_timeout), "--route-timeout", "2",
            "--router", router, "--dispatcher", dispatcher, *fleet_flags,
        )["port"]  # fmt: skip
        stack = DisaggStack(procs, f"http://127.0.0.1:{http}", names)

        def all_routable() -> bool:
            # A dry run lists the decode candidates and, with a hop, the prefill ones.
            return len(stack.dry_route().get("workers", [])) == len(engine_args)

        wait_until(all_routable, timeout=60, what="every engine routable")
        yield stack


def count(log: str, what: str) -> int:
    return len(re.findall(what, log))


def settled(read: Callable[[], int], expected: int, timeout: float = 10.0) -> int:
    """A count that may lag the answers: the prefill side logs "kv handed over" when the
    decode engine's receipt reaches it, which can come after the client has its answer. Waits
    (bounded) until it reaches `expected`, then returns it (whatever it is by then)."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: read() >= expected, timeout=timeout, what="the handover log lines")
    return read()


SGLANG_ENGINES = [
    ["--role", "prefill", "--bootstrap-port", "0"],
    ["--role", "decode"],
    ["--role", "decode"],
]
VLLM_ENGINES = [["--role", "prefill"], ["--role", "decode"], ["--role", "decode"]]


@pytest.mark.parametrize(
    ("protocol", "engines"), [("sglang", SGLANG_ENGINES), ("vllm", VLLM_ENGINES)]
)
def test_disaggregated_outputs_match_aggregated_and_kv_moves(protocol, engines, aggregated_texts):
    with disagg_stack(protocol, engines) as stack:
        route = stack.dry_route()
        roles = sorted(w["role"] for w in route["workers"])
        assert roles == ["decode", "decode", "prefill"]
        for p in PROMPTS:
            assert text_of(chat(stack.base, p)) == aggregated_texts[p]
        decode_logs = [stack.procs.log(n) for n in stack.engines[1:]]
        assert sum(count(log, "kv received") for log in decode_logs) == len(PROMPTS)
        handed = settled(
            lambda: count(stack.procs.log(stack.engines[0]), "kv handed over"), len(PROMPTS)
        )
        assert handed == len(PROMPTS), stack.procs.log(stack.engines[0])[-3000:]

        # A killed prefill engine: decode-only engines cannot prefill, so each request ends
        # with a clean error (or succeeds), within a bounded time.
        stack.procs.kill(stack.engines[0])
        for p in PROMPTS:
            started = time.monotonic()
            reply = chat(stack.base, p, timeout=30)
            assert time.monotonic() - started < 25
            if reply.status_code == 200:
                assert text_of(reply) == aggregated_texts[p]
            else:
                assert reply.status_code in (500, 502, 503, 504), reply.text
                assert reply.json()["error"]


def test_vllm_roles_mixed_from_engines_and_fleet_list(aggregated_texts):
    """Prefill: a kv_both engine (no role of its own) listed with fleet's --prefill; decode: a
    kv_consumer (--role decode) and a kv_both engine not listed (decode by fleet, and it can
    prefill locally). Once the prefill engine dies, requests fall back to the kv_both one."""
    engines = [
        ["--kv-connector", "NixlConnector"],
        ["--role", "decode"],
        ["--kv-connector", "NixlConnector"],
    ]
    with disagg_stack("vllm", engines, listed_prefill=(0,)) as stack:
        roles = sorted(w["role"] for w in stack.dry_route()["workers"])
        assert roles == ["decode", "decode", "prefill"]
        for p in PROMPTS:
            assert text_of(chat(stack.base, p)) == aggregated_texts[p]
        # Short prompts on the kv_both decode engine skip the hop (it prefills them itself,
        # under --disagg-min-uncached-tokens); those on the kv_consumer always take it.
        received = count(stack.procs.log(stack.engines[1]), "kv received")
        handed = settled(
            lambda: count(stack.procs.log(stack.engines[0]), "kv handed over"), received
        )
        assert handed == received
        assert count(stack.procs.log(stack.engines[2]), "kv received") == 0
        assert handed <= len(PROMPTS)
        # A long prompt (over the threshold) takes the hop whichever decode engine serves it.
        assert chat(stack.base, "railway yards " * 150).status_code == 200
        received = sum(count(stack.procs.log(n), "kv received") for n in stack.engines[1:])
        assert received == handed + 1
        after = settled(
            lambda: count(stack.procs.log(stack.engines[0]), "kv handed over"), handed + 1
        )
        assert after == handed + 1

        stack.procs.kill(stack.engines[0])
        for p in PROMPTS:
            started = time.monotonic()
            reply = chat(stack.base, p, timeout=30)
            assert time.monotonic() - started < 25
            assert text_of(reply) == aggregated_texts[p]


def test_switchyard_up_with_role_mocks(aggregated_texts):
    """`switchyard up --mock-prefill ... --mock-decode ...`: both protocols disaggregated."""
    args = ["--mock-prefill", "sglang,vllm", "--mock-decode", "sglang,vllm"]
    with running_stack(*args) as stack:

        def hop_ready() -> bool:
            # Ready means some engine is routable; wait for the decode and prefill ones.
            try:
                reply = httpx.post(
                    stack.base_url + "/debug/route", json={"model": MODEL, "prompt": "x"}
                )
            except httpx.HTTPError:
                return False
            roles = [w["role"] for w in reply.json().get("workers", [])]
            return roles.count("decode") == 2 and "prefill" in roles

        wait_until(hop_ready, timeout=30, what="decode and prefill engines routable")
        for p in PROMPTS:
            assert text_of(chat(stack.base_url, p)) == aggregated_texts[p]
        assert count(stack.log(), "kv received") == len(PROMPTS)
        assert settled(lambda: count(stack.log(), "kv handed over"), len(PROMPTS)) == len(PROMPTS)


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
@pytest.mark.parametrize("fault", ["--exit-on-kv-fetch", "--exit-after-tokens=1"])
def test_prefill_engine_crashing_mid_request_streams_go_on(protocol, fault, aggregated_texts):
    """Two prefill engines; the one the router picks first (round robin's first turn: the
    lowest instance id) crashes (os._exit) in the middle of its first request: as the decode
    engine fetches the KV (before any is sent), or once the prefill is done and handed over.
    Every request gets the aggregated answer, within bounded time; a transfer cut short sends
    the request through the other prefill engine."""
    prefill = ["--role", "prefill"] + (["--bootstrap-port", "0"] if protocol == "sglang" else [])
    engines = [prefill + [fault], prefill, ["--role", "decode"], ["--role", "decode"]]
    with disagg_stack(protocol, engines, first_picked=True) as stack:
        crashed = stack.procs.procs[stack.engines[0]]
        for p in PROMPTS:
            started = time.monotonic()
            assert text_of(chat(stack.base, p, timeout=30)) == aggregated_texts[p]
            assert time.monotonic() - started < 25
        assert crashed.poll() is not None, "the crashing prefill engine was never used"
        crashed_log = stack.procs.log(stack.engines[0])
        least = len(PROMPTS) if fault == "--exit-on-kv-fetch" else len(PROMPTS) - 1
        handed = settled(lambda: count(stack.procs.log(stack.engines[1]), "kv handed over"), least)
        if fault == "--exit-on-kv-fetch":
            # Nothing left the crashed engine: every prompt was prefilled by the other one.
            assert count(crashed_log, "kv handed over") == 0
            assert handed == len(PROMPTS)
        else:
            assert count(crashed_log, "kv handed over") <= 1
            assert handed >= len(PROMPTS) - 1
