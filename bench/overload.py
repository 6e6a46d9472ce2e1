"""Overload: offered load from 1x to 10x of what the stack can serve, with admission control on.

`switchyard up` on two mock engines with `--max-concurrent-requests SLOTS` and
`--max-queued-requests QUEUE`. Capacity is measured first: SLOTS closed-loop clients for
`--seconds`, completed requests per second (R). Then for each level k, Poisson arrivals at
k x R requests per second for `--seconds` (open loop: a 429 is not retried), every request a
stream of `--max-tokens` tokens. Per level:

  goodput      completed requests (and tokens) per second
  429 rate     the share of offered requests answered 429 (each with Retry-After)
  5xx          any other failure (should be 0)
  TTFT p50/p99 of the admitted requests (their wait in the queue included), as the client
               sees it, and the p99 the preprocessor measured (from its histogram: the upper
               bound of the bucket; from the request's headers being read, so without the
               client's and the accept queue's delays)
  memory       the preprocessor's peak RSS so far (VmHWM), and the stack's RSS peak sampled
               during the level (every process of `up`)

One run, one machine: compare levels with each other, not with other runs.

    python bench/overload.py                   # levels 1..10, 8 s each
    python bench/overload.py --levels 1,5,10 --seconds 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
from harness import pct, started, stop, wait_ready
from procstat import children_map, tree

HERE = Path(__file__).resolve().parent
MODEL = "deepseek-mock"


@dataclass
class Level:
    load: float  # multiple of the measured capacity
    rate: float  # offered requests per second
    offered: int = 0
    completed: int = 0
    tokens: int = 0
    limited: int = 0
    retry_after_missing: int = 0
    failed: int = 0
    first_failure: str = ""
    ttfts: list[float] = field(default_factory=list)
    seconds: float = 0.0
    preprocessor_peak_mib: float = 0.0
    stack_rss_peak_mib: float = 0.0
    server_ttft_p99_s: float = 0.0

    def row(self) -> dict[str, float | int | str]:
        return {
            "load": self.load,
            "offered_per_s": round(self.rate, 2),
            "offered": self.offered,
            "goodput_req_s": round(self.completed / self.seconds, 2) if self.seconds else 0.0,
            "goodput_tok_s": round(self.tokens / self.seconds, 1) if self.seconds else 0.0,
            "rate_429": round(self.limited / self.offered, 3) if self.offered else 0.0,
            "retry_after_missing": self.retry_after_missing,
            "failed": self.failed,
            "first_failure": self.first_failure,
            "ttft_p50_ms": round(pct(self.ttfts, 0.5) * 1e3, 1) if self.ttfts else 0.0,
            "ttft_p99_ms": round(pct(self.ttfts, 0.99) * 1e3, 1) if self.ttfts else 0.0,
            "server_ttft_p99_le_s": self.server_ttft_p99_s,
            "preprocessor_peak_mib": round(self.preprocessor_peak_mib, 1),
            "stack_rss_peak_mib": round(self.stack_rss_peak_mib, 1),
        }


TTFT_METRIC = "switchyard_preprocessor_time_to_first_token_seconds_bucket"


def ttft_buckets(base: str) -> dict[float, float]:
    """The preprocessor's TTFT histogram: upper bound -> cumulative count."""
    text = httpx.get(base + "/metrics", timeout=10).text
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(TTFT_METRIC):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def p99_bound(before: dict[float, float], after: dict[float, float]) -> float:
    """The upper bound of the bucket holding the 99th percentile of what was added."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if total and count >= 0.99 * total:
            return bound
    return 0.0


def status_kib(pid: int, key: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def stack_rss_mib(root: int) -> float:
    return sum(status_kib(pid, "VmRSS:") for pid in tree(root, children_map())) / 1024


class Reply:
    """One HTTP/1.1 exchange on its own connection (`Connection: close`): a load generator
    needs no pool (httpx's grows slow with hundreds of requests waiting in it)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.status = 0
        self.headers: dict[str, str] = {}

    @classmethod
    async def post(cls, host: str, port: int, path: str, body: bytes, headers: str = "") -> Reply:
        """`headers`: more header lines, each ending in CRLF."""
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n{headers}\r\n".encode()
            + body
        )
        reply = cls(reader, writer)
        status = await reader.readline()
        reply.status = int(status.split()[1])
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            reply.headers[name.strip().lower()] = value.strip()
        return reply

    async def lines(self):  # type: ignore[no-untyped-def]
        """The body's lines (chunked or not)."""
        pending = b""
        chunked = self.headers.get("transfer-encoding") == "chunked"
        while True:
            if chunked:
                size = int((await self.reader.readline()).strip() or b"0", 16)
                if size == 0:
                    break
                data = await self.reader.readexactly(size + 2)
                pending += data[:-2]
            else:
                data = await self.reader.read(65536)
                if not data:
                    break
                pending += data
            *done, pending = pending.split(b"\n")
            for line in done:
                yield line.decode()
        if pending:
            yield pending.decode()

    def close(self) -> None:
        self.writer.close()


async def read_stream(reply: Reply, t0: float) -> tuple[float | None, int, str | None]:
    """A streamed chat's time to its first content (None: none came), its completion tokens
    (from the usage chunk) and the error event's line (None: none)."""
    first = None
    tokens = 0
    async for line in reply.lines():
        if not line.startswith("data: {"):
            continue
        if line.startswith('data: {"error"'):  # a token may be the word "error"
            return first, tokens, line[:200]
        if first is None and '"content":"' in line and '"content":""' not in line:
            first = time.perf_counter() - t0
        if '"usage":{' in line:
            tokens = orjson.loads(line[6:])["usage"]["completion_tokens"]
    return first, tokens, None


async def one(target: tuple[str, int], n: int, max_tokens: int, level: Level) -> None:
    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"overload request {n}: a shunting plan"}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    )
    t0 = time.perf_counter()
    reply = None
    try:
        reply = await Reply.post(*target, "/v1/chat/completions", body)
        if reply.status == 429:
            level.limited += 1
            if not reply.headers.get("retry-after"):
                level.retry_after_missing += 1
            return
        if reply.status != 200:
            level.failed += 1
            level.first_failure = level.first_failure or f"{reply.status}"
            return
        first, tokens, error = await read_stream(reply, t0)
        if error is not None:
            level.failed += 1
            level.first_failure = level.first_failure or error
            return
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        level.failed += 1
        level.first_failure = level.first_failure or repr(exc)
        return
    finally:
        if reply is not None:
            reply.close()
    if tokens != max_tokens:
        level.failed += 1
        level.first_failure = level.first_failure or f"{tokens} of {max_tokens} tokens"
        return
    level.completed += 1
    level.tokens += tokens
    if first is not None:
        level.ttfts.append(first)


def target_of(base: str) -> tuple[str, int]:
    parts = urlsplit(base)
    assert parts.hostname and parts.port
    return parts.hostname, parts.port


async def capacity(base: str, slots: int, seconds: float, max_tokens: int) -> float:
    """Completed requests per second with `slots` clients back to back."""
    probe = Level(load=1.0, rate=0.0)
    target = target_of(base)
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def client(k: int) -> None:
        n = 0
        while loop.time() < end:
            await one(target, k * 100_000 + n, max_tokens, probe)
            n += 1

    t0 = loop.time()
    await asyncio.gather(*(client(k) for k in range(slots)))
    elapsed = loop.time() - t0
    if probe.failed or not probe.completed:
        raise RuntimeError(f"capacity run failed: {probe.first_failure or 'nothing completed'}")
    return probe.completed / elapsed


async def offer(
    base: str, level: Level, seconds: float, max_tokens: int, pids: tuple[int, int], seed: int
) -> None:
    up_pid, pre_pid = pids
    rng = random.Random(seed)
    target = target_of(base)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    end = t0 + seconds
    tasks: list[asyncio.Task[None]] = []
    sample_at = t0
    at = t0
    while True:
        at += rng.expovariate(level.rate)
        if at >= end:
            break
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        level.offered += 1
        tasks.append(asyncio.create_task(one(target, level.offered, max_tokens, level)))
        if loop.time() >= sample_at:
            level.stack_rss_peak_mib = max(level.stack_rss_peak_mib, stack_rss_mib(up_pid))
            sample_at = loop.time() + 0.5
    await asyncio.gather(*tasks)
    level.seconds = loop.time() - t0
    level.stack_rss_peak_mib = max(level.stack_rss_peak_mib, stack_rss_mib(up_pid))
    level.preprocessor_peak_mib = status_kib(pre_pid, "VmHWM:") / 1024


def table(levels: list[Level], header: str) -> str:
    lines = [
        header,
        "",
        "| load | offered/s | goodput req/s | goodput tok/s | 429 rate | 5xx / errors "
        "| TTFT p50 ms | TTFT p99 ms | server TTFT p99 <= s | preprocessor peak MiB "
        "| stack RSS peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in levels:
        r = level.row()
        lines.append(
            f"| {r['load']:g}x | {r['offered_per_s']} | {r['goodput_req_s']} | "
            f"{r['goodput_tok_s']} | {r['rate_429']:.1%} | {r['failed']} | {r['ttft_p50_ms']} | "
            f"{r['ttft_p99_ms']} | {r['server_ttft_p99_le_s']:g} | {r['preprocessor_peak_mib']} | "
            f"{r['stack_rss_peak_mib']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=8, help="--max-concurrent-requests")
    parser.add_argument("--queue", type=int, default=8, help="--max-queued-requests")
    parser.add_argument("--queue-timeout", type=float, default=2.0)
    parser.add_argument("--levels", default="1,2,3,4,5,6,7,8,9,10")
    parser.add_argument("--seconds", type=float, default=8.0, help="per level")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--itl-ms", type=float, default=10.0, help="the mock engines' pace")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "overload.md")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    levels = [float(x) for x in args.levels.split(",") if x]
    proc, report = started(
        "up", "--http-port", "0", "--log-level", "WARNING",
        "--mock-engines", "sglang,vllm", "--mock-itl-ms", str(args.itl_ms),
        "--max-concurrent-requests", str(args.slots),
        "--max-queued-requests", str(args.queue),
        "--queue-timeout", str(args.queue_timeout),
        timeout=120, start_new_session=True,
    )  # fmt: skip
    base = report["base_url"]
    try:
        wait_ready(base, proc)
        pre_pid = int(report["pids"]["preprocessor"])
        r = asyncio.run(capacity(base, args.slots, args.seconds, args.max_tokens))
        results = []
        for n, load in enumerate(levels):
            level = Level(load=load, rate=load * r)
            before = ttft_buckets(base)
            asyncio.run(
                offer(
                    base, level, args.seconds, args.max_tokens, (proc.pid, pre_pid), args.seed + n
                )
            )
            level.server_ttft_p99_s = p99_bound(before, ttft_buckets(base))
            print(json.dumps(level.row()), flush=True)
            results.append(level)
    finally:
        stop(proc)
    header = (
        f"Offered load against `switchyard up` (2 mock engines, {args.itl_ms:g} ms/token, "
        f"{args.max_tokens}-token streams) with --max-concurrent-requests {args.slots}, "
        f"--max-queued-requests {args.queue}, --queue-timeout {args.queue_timeout:g}. "
        f"Capacity measured first: {r:.2f} completed requests/s with {args.slots} closed-loop "
        f"clients; each level offers Poisson arrivals at load x capacity for {args.seconds:g} s. "
        "One run on one machine (shared: compare levels, not runs)."
    )
    text = table(results, header)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "capacity_req_s": r,
                "args": vars(args) | {"out": str(args.out)},
                "levels": [lv.row() for lv in results],
            },
            indent=1,
        )  # fmt: skip
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
