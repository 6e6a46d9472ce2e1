"""What faults cost: the extra latency a migration adds to a stream, and how long a restarted
engine takes to get traffic again. Reuses the chaos tests' service-by-service stack.

    python bench/faults.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_chaos import MODEL, STREAMS, chaos_stack, models_instances, prompt  # noqa: E402

MAX_TOKENS = 40


async def stream_gaps(
    client: openai.AsyncOpenAI, n: int, started: list[int], all_started: asyncio.Event
) -> tuple[float, float]:
    """(largest gap between content chunks, end-to-end seconds) of one stream."""
    t0 = time.perf_counter()
    last = None
    gap = 0.0
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=prompt(n),
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            if last is None:
                started[0] += 1
                if started[0] == STREAMS:
                    all_started.set()
            else:
                gap = max(gap, now - last)
            last = now
    return gap, time.perf_counter() - t0


async def run(base: str, fault=None) -> list[tuple[float, float]]:
    started, all_started = [0], asyncio.Event()
    async with openai.AsyncOpenAI(
        base_url=base + "/v1", api_key="none", max_retries=0, timeout=120
    ) as client:
        tasks = [
            asyncio.create_task(stream_gaps(client, n, started, all_started))
            for n in range(STREAMS)
        ]
        if fault is not None:
            await asyncio.wait_for(all_started.wait(), 60)
            await asyncio.to_thread(fault)
        return await asyncio.gather(*tasks)


def main() -> int:
    with chaos_stack() as stack:
        calm = asyncio.run(run(stack.base))
        hit = asyncio.run(run(stack.base, fault=lambda: stack.procs.kill("engine-0")))
        normal_gap = statistics.median(g for g, _ in calm)
        migrated = sorted((g for g, _ in hit), reverse=True)[: STREAMS // 3]
        e2e_calm = statistics.mean(d for _, d in calm)
        e2e_hit = statistics.mean(d for _, d in hit)
        restart_at = time.monotonic()
        stack.restart("engine-0")
        while len(models_instances(stack.base)) < 3:
            time.sleep(0.05)
        readmitted = time.monotonic() - restart_at
        body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
        httpx.post(stack.base + "/v1/completions", json=body, timeout=30)
    print(
        f"{STREAMS} streams x {MAX_TOKENS} tokens over 3 mock engines (25 ms/token), "
        "engine-0 SIGKILLed once every stream had its first token\n"
    )
    print("| measure | value |\n|---|---|")
    print(
        f"| largest gap between chunks, fault-free (median over streams) | "
        f"{normal_gap * 1e3:.0f} ms |"
    )
    print(
        f"| largest gap in the ~1/3 of streams that migrated (median, max) | "
        f"{statistics.median(migrated) * 1e3:.0f} ms, {max(migrated) * 1e3:.0f} ms |"
    )
    print(
        f"| mean stream duration, fault-free / with the kill | {e2e_calm:.2f} s / {e2e_hit:.2f} s |"
    )
    print(
        f"| restarted engine back in the routable set after its process started | "
        f"{readmitted:.2f} s |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
