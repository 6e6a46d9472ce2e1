"""The load generator: targets (an OpenAI HTTP endpoint, or engines straight over gRPC),
closed-loop (fixed concurrency) and open-loop (Poisson arrivals) drivers, per-request samples.

Requests stream unless the target is made with `stream=False`. TTFT is the time to the first
content token (HTTP: the first SSE chunk whose delta has content; gRPC: the first token delta);
ITL is the mean gap between a request's output tokens after the first, (last token - first
token) / (tokens - 1); E2E runs to the end of the stream. A non-streamed request has no token
timings: its TTFT is its E2E, and it has no ITL.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
import orjson

from switchyard.common.engines.base import EngineClient
from switchyard.common.engines.connect import connect
from switchyard.protos.messages import GenerateFinished, GenerateRequest, SamplingParams

WORDS = (
    "yard track wagon signal switch engine freight depot siding junction platform timetable "
    "coupling brake ballast sleeper gauge points lever cabin dispatcher shunt hump marshal "
    "consist manifest tanker hopper boxcar flatcar caboose locomotive diesel electric catenary "
    "pantograph bogie axle wheel flange rail spike tie plate bolt crossing level barrier lamp "
    "whistle horn bell token staff tablet block section occupancy circuit relay interlocking "
    "route set release cancel approach home distant starter shunting ground disc dwarf repeater"
).split()


@dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, str]]
    token_ids: list[int] | None = None  # for the gRPC floor: the chat-templated prompt


def prompts(target: str, phase: str, n: int, words: int, seed: int) -> list[Prompt]:
    """n prompts of `words` words each for one phase of one target. Every target gets the same
    words for a phase; only the short target code (same length for every target) at the start
    differs, so no engine has any of a prompt cached (beyond the chat template's first tokens)
    whichever target ran before, and every target pays the same prefill."""
    rng = random.Random(f"{seed}-{phase}")
    return [
        Prompt(
            [
                {
                    "role": "user",
                    "content": f"[{target} {phase} {i}] " + " ".join(rng.choices(WORDS, k=words)),
                }
            ]
        )
        for i in range(n)
    ]


@dataclass(frozen=True)
class Sample:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    tokens: int = 0
    last: float = 0.0  # time of the last token, from the start
    error: str = ""

    streamed: bool = True

    @property
    def itl(self) -> float | None:
        if self.tokens < 2 or not self.streamed:
            return None
        return (self.last - self.ttft) / (self.tokens - 1)


class Target:
    """One way to send a request. `open` before a phase's first request, `close` at the end."""

    name: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def prepare(self, items: list[Prompt]) -> list[Prompt]:
        return items

    async def send(self, index: int, prompt: Prompt) -> Sample:
        raise NotImplementedError


class HttpTarget(Target):
    """Streamed chat completions on an OpenAI-compatible endpoint (Switchyard, smg).

    Requests are spread over `lanes` httpx clients (request i on lane i % lanes): one client's
    connection pool costs CPU in proportion to its open connections on every request, which
    made the client itself the bottleneck at concurrency 128."""

    def __init__(
        self,
        name: str,
        base: str,
        model: str,
        max_tokens: int,
        lanes: int = 16,
        stream: bool = True,
    ) -> None:
        self.name = name
        self.base = base
        self.model = model
        self.max_tokens = max_tokens
        self.lanes = lanes
        self.stream = stream
        self.clients: list[httpx.AsyncClient] = []

    async def open(self) -> None:
        self.clients = [
            httpx.AsyncClient(
                base_url=self.base,
                timeout=httpx.Timeout(120.0, connect=10.0),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
            )
            for _ in range(self.lanes)
        ]

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()
        self.clients = []

    async def send(self, index: int, prompt: Prompt) -> Sample:
        http = self.clients[index % len(self.clients)]
        body = {
            "model": self.model,
            "messages": prompt.messages,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        if not self.stream:
            return await self._whole(http, body)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        start = time.perf_counter()
        first = last = 0.0
        chunks = 0
        usage_tokens = None
        try:
            async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
                if reply.status_code != 200:
                    text = (await reply.aread())[:200].decode(errors="replace")
                    return Sample(ok=False, error=f"HTTP {reply.status_code}: {text}")
                async for line in reply.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = orjson.loads(line[6:])
                    choices = chunk.get("choices")
                    if choices and choices[0].get("delta", {}).get("content"):
                        last = time.perf_counter() - start
                        if not chunks:
                            first = last
                        chunks += 1
                    usage = chunk.get("usage")
                    if usage:
                        usage_tokens = usage.get("completion_tokens")
        except (httpx.HTTPError, OSError) as exc:
            return Sample(ok=False, error=f"{type(exc).__name__}: {exc}"[:200])
        end = time.perf_counter() - start
        if not chunks:
            return Sample(ok=False, error="stream ended without a content token")
        tokens = usage_tokens if usage_tokens else chunks
        return Sample(ok=True, ttft=first, e2e=end, tokens=tokens, last=last)

    async def _whole(self, http: httpx.AsyncClient, body: dict) -> Sample:
        start = time.perf_counter()
        try:
            reply = await http.post("/v1/chat/completions", json=body)
        except (httpx.HTTPError, OSError) as exc:
            return Sample(ok=False, error=f"{type(exc).__name__}: {exc}"[:200])
        end = time.perf_counter() - start
        if reply.status_code != 200:
            return Sample(ok=False, error=f"HTTP {reply.status_code}: {reply.text[:200]}")
        tokens = orjson.loads(reply.content)["usage"]["completion_tokens"]
        return Sample(ok=True, ttft=end, e2e=end, tokens=tokens, last=end, streamed=False)


class GrpcFloor(Target):
    """The floor: the same requests straight to the engines over gRPC (no frontend), spread
    round-robin over the engines, prompts pre-tokenized with the stack's tokenizer and chat
    template."""

    def __init__(
        self,
        name: str,
        urls: Sequence[str],
        max_tokens: int,
        encode: Callable[[Prompt], list[int]],
        stream: bool = True,
    ) -> None:
        self.name = name
        self.stream = stream
        self.urls = list(urls)
        self.sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.encode = encode
        self.clients: list[EngineClient] = []
        self.ids = itertools.count()

    async def open(self) -> None:
        self.clients = [await connect(url) for url in self.urls]

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        self.clients = []

    def prepare(self, items: list[Prompt]) -> list[Prompt]:
        return [Prompt(p.messages, self.encode(p)) for p in items]

    async def send(self, index: int, prompt: Prompt) -> Sample:
        assert prompt.token_ids is not None
        client = self.clients[index % len(self.clients)]
        request = GenerateRequest(
            request_id=f"floor-{next(self.ids)}",
            instance_id=0,
            token_ids=prompt.token_ids,
            sampling=self.sampling,
            stream=self.stream,
        )
        start = time.perf_counter()
        first = last = 0.0
        tokens = 0
        finished = False
        try:
            async for event in client.generate(request):
                if type(event) is GenerateFinished:
                    finished = True
                    break
                last = time.perf_counter() - start
                if not tokens:
                    first = last
                tokens += len(event.token_ids)
        except Exception as exc:  # an EngineError or a transport fault: count it, go on
            return Sample(ok=False, error=f"{type(exc).__name__}: {exc}"[:200])
        end = time.perf_counter() - start
        if not finished or not tokens:
            return Sample(ok=False, error="stream ended without tokens or a final message")
        if not self.stream:
            return Sample(ok=True, ttft=end, e2e=end, tokens=tokens, last=end, streamed=False)
        return Sample(ok=True, ttft=first, e2e=end, tokens=tokens, last=last)


async def closed_loop(
    target: Target, items: list[Prompt], concurrency: int, done: Callable[[], None]
) -> tuple[list[Sample], float]:
    """`concurrency` workers, each sending its next request as soon as its last one ends.
    Returns the samples and the wall time from the first send to the last end."""
    samples: list[Sample | None] = [None] * len(items)
    indexes = iter(range(len(items)))

    async def worker() -> None:
        for i in indexes:
            samples[i] = await target.send(i, items[i])
            done()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)))))
    wall = time.perf_counter() - start
    return [s for s in samples if s is not None], wall


async def closed_run(
    base: str,
    model: str,
    tokens: int,
    phase: str,
    n: int,
    concurrency: int,
    stream: bool = True,
    words: int = 48,
    code: str = "S0",
) -> tuple[list[Sample], float]:
    """`n` new prompts of `words` words (`prompts(code, phase, ...)`) on a fresh client, closed
    loop at `concurrency`: the samples and the wall time; raises when any request failed (for
    benches that measure the stack, not the load)."""
    target = HttpTarget("switchyard", base, model, tokens, stream=stream)
    await target.open()
    try:
        items = prompts(code, phase, n, words, 1)
        samples, wall = await closed_loop(target, items, concurrency, lambda: None)
    finally:
        await target.close()
    bad = [s for s in samples if not s.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} failed requests, e.g. {bad[0].error}")
    return samples, wall


async def open_loop(
    target: Target, items: list[Prompt], rate: float, seed: int, done: Callable[[], None]
) -> tuple[list[Sample], float]:
    """Poisson arrivals at `rate` requests/s, whatever is still in flight."""
    rng = random.Random(seed)

    async def one(i: int) -> Sample:
        sample = await target.send(i, items[i])
        done()
        return sample

    start = time.perf_counter()
    due = 0.0
    tasks = []
    for i in range(len(items)):
        delay = start + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
        due += rng.expovariate(rate)
    samples = list(await asyncio.gather(*tasks))
    return samples, time.perf_counter() - start
