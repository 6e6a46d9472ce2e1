"""Do long prompts stall everyone else's stream? Token gaps of short streams while long prompts
arrive, with long prompts tokenized off the event loop (the default) and inline.

One preprocessor process streams every request's tokens from one event loop. Tokenizing a
long prompt inline holds that loop (and the GIL) for its whole encode; with the default, a
prompt of at least --tokenize-offload-chars characters is encoded on a worker thread without
the GIL. Two stacks run in turn on the same two mock engines:

  offloaded   `switchyard up` as shipped
  inline      `switchyard up --preprocessor-arg=--tokenize-offload-chars=<huge>`

Each runs the same workload: `--streams` short chat streams back to back (closed loop), while
a long prompt (~`--long-chars` characters, well inside the context window) arrives every
`--long-every` seconds. Recorded per short stream: the largest gap between two content
chunks, and all gaps; reported: p50/p99/max of the gaps and of the per-stream largest gap,
and the inline/offloaded ratio (same run). Results: bench/results/long_prompts.md.

    python bench/long_prompts.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from harness import pct
from load import MODEL, Processes, served_tokenizer_dir, start_engines, switchyard_stack

HERE = Path(__file__).resolve().parent


async def short_stream(http: httpx.AsyncClient, n: int, max_tokens: int) -> list[float]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"short question number {n}"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    gaps: list[float] = []
    last = None
    async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choices = orjson.loads(line[6:]).get("choices")
            if choices and choices[0].get("delta", {}).get("content"):
                now = time.perf_counter()
                if last is not None:
                    gaps.append(1000 * (now - last))
                last = now
    return gaps


async def long_request(http: httpx.AsyncClient, n: int, chars: int) -> None:
    words = f"long document {n} about freight yards, switches and signals. "
    text = (words * (chars // len(words) + 1))[:chars]
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    reply = await http.post("/v1/chat/completions", json=body)
    reply.raise_for_status()


async def workload(base: str, args: argparse.Namespace) -> tuple[list[float], list[float], int]:
    gaps: list[float] = []
    worst: list[float] = []
    longs = 0
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as http:
        stop = asyncio.Event()
        counter = iter(range(10**9))

        async def lane() -> None:
            while not stop.is_set():
                stream = await short_stream(http, next(counter), args.max_tokens)
                gaps.extend(stream)
                if stream:
                    worst.append(max(stream))

        async def longs_loop() -> None:
            nonlocal longs
            pending: set[asyncio.Task[None]] = set()
            while not stop.is_set():
                task = asyncio.create_task(long_request(http, longs, args.long_chars))
                pending.add(task)
                task.add_done_callback(pending.discard)
                longs += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.long_every)
            await asyncio.gather(*pending)

        lanes = [asyncio.create_task(lane()) for _ in range(args.streams)]
        sender = asyncio.create_task(longs_loop())
        await asyncio.sleep(args.seconds)
        stop.set()
        await asyncio.gather(*lanes, sender)
    return gaps, worst, longs


def row(name: str, gaps: list[float], worst: list[float], longs: int) -> dict[str, float | str]:
    return {
        "name": name,
        "gap p50": pct(gaps, 0.5),
        "gap p99": pct(gaps, 0.99),
        "gap max": max(gaps),
        "worst p50": pct(worst, 0.5),
        "worst p99": pct(worst, 0.99),
        "streams": len(worst),
        "longs": longs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=16, help="concurrent short streams")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--long-chars", type=int, default=24_000, help="~6k tokens")
    parser.add_argument("--long-every", type=float, default=0.1, help="seconds")
    parser.add_argument("--seconds", type=float, default=15.0, help="per configuration")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "long_prompts.md")
    args = parser.parse_args()

    configs = [
        ("offloaded (default)", []),
        ("inline", ["--preprocessor-arg=--tokenize-offload-chars=1000000000"]),
    ]
    rows = []
    with tempfile.TemporaryDirectory(prefix="switchyard-long-") as tmp:
        procs = Processes(Path(tmp))
        try:
            tokenizer, _ = served_tokenizer_dir(Path(tmp) / "tokenizer")
            _engines, _urls, kv_urls = start_engines(procs, 2, tokenizer, 20.0, 5.0)
            for name, extra in configs:
                print(f"[long_prompts] {name} ...", file=sys.stderr)
                mode = "round_robin"
                with switchyard_stack(procs, "switchyard", kv_urls, mode, extra) as (base, _):
                    asyncio.run(workload(base, argparse.Namespace(**{**vars(args), "seconds": 2})))
                    gaps, worst, longs = asyncio.run(workload(base, args))
                rows.append(row(name, gaps, worst, longs))
        finally:
            procs.stop_all()

    base = rows[0]
    lines = [
        "# Long prompts: token gaps of short streams while long prompts arrive",
        "",
        f"2 SGLang-protocol mock engines (ITL 5 ms), round-robin; {args.streams} short chat "
        f"streams of {args.max_tokens} tokens back to back, plus one ~{args.long_chars}-"
        f"character prompt every {args.long_every:g} s; {args.seconds:g} s per configuration. "
        "gap = time between two content chunks of one short stream; worst = a stream's "
        "largest gap. Ratios: this configuration over the offloaded one, same run.",
        "",
        "| configuration | gap p50 ms | gap p99 ms | gap max ms | worst p50 ms | worst p99 ms "
        "| gap p99 ratio | worst p99 ratio | short streams | long prompts |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['gap p50']:.2f} | {r['gap p99']:.2f} | {r['gap max']:.1f} "
            f"| {r['worst p50']:.1f} | {r['worst p99']:.1f} "
            f"| {r['gap p99'] / base['gap p99']:.2f}x | {r['worst p99'] / base['worst p99']:.2f}x "
            f"| {r['streams']} | {r['longs']} |"
        )
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
