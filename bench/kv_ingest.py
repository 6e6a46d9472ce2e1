"""KV-event ingestion and prefix-index query cost, in one process (no sockets).

1. Ingestion: events/second that decode (msgpack -> records) + KvIndex.apply_batch sustain on
   a synthetic but engine-shaped workload: 16 workers; requests of 3 BlockStored events of 8
   blocks x 16 tokens, chained, 60% of them under a shared 8-block system prompt; LRU
   eviction (BlockRemoved of 8 blocks) once a worker holds more than --capacity blocks.
   Each request's stores and evictions go as one batch. Both event encodings.
2. Query: overlaps() for an 8k-token prompt (512 blocks of 16) over 16 workers holding
   prefixes of it of different lengths, on the index left by (1); plus the worst case (every
   worker holds all 512 blocks) and the request-side block_hashes() of the prompt.

    python bench/kv_ingest.py [--requests 12000] [--capacity 4096]

The same script measures the previous router too (before/after in one table): run it with
that checkout's interpreter (`/work/main/.venv/bin/python bench/kv_ingest.py`); workers are
keyed as that index expects.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque
from typing import Any

import msgspec

from switchyard.common import block_hash
from switchyard.common.block_hash import block_hashes
from switchyard.router.kv import decode
from switchyard.router.kv.index import KvIndex

# What the subscriber decodes with: token ids left as msgpack for the C hash where the router
# has it (decode_payload_packed), else decode_payload.
decode_payload = getattr(decode, "decode_payload_packed", decode.decode_payload)
HASHING = "C" if getattr(block_hash, "NATIVE", False) else "Python"

# The current index keys a worker by (instance id, data-parallel rank), the previous one by id.
NEW_API = hasattr(KvIndex, "overlaps_with")


def key(worker: int) -> Any:
    return (worker, 0) if NEW_API else worker


WORKERS = 16
BLOCK = 16
BLOCKS_PER_EVENT = 8
EVENTS_PER_REQUEST = 3
VOCAB = 150_000


def stored(encoding: str, hashes: list[int], parent: int | None, tokens: list[int]) -> Any:
    if encoding == "array":
        return ["BlockStored", hashes, parent, tokens, BLOCK, None, "GPU"]
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BLOCK,
        "lora_id": None,
        "medium": "GPU",
    }


def removed(encoding: str, hashes: list[int]) -> Any:
    if encoding == "array":
        return ["BlockRemoved", hashes, "GPU"]
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def workload(encoding: str, requests: int, capacity: int, seed: int = 0):
    """[(worker, payload)], events, blocks stored."""
    rng = random.Random(seed)
    event_tokens = BLOCK * BLOCKS_PER_EVENT
    system_tokens = [rng.randrange(VOCAB) for _ in range(event_tokens)]
    system_hashes = [2**63 + i for i in range(BLOCKS_PER_EVENT)]  # same engine ids everywhere
    next_hash = [w << 40 for w in range(WORKERS)]
    live: list[deque[list[int]]] = [deque() for _ in range(WORKERS)]
    held = [0] * WORKERS
    out: list[tuple[int, bytes]] = []
    events = blocks = 0
    for w in range(WORKERS):
        out.append(
            (
                w,
                msgspec.msgpack.encode(
                    [0.0, [stored(encoding, system_hashes, None, system_tokens)], 0]
                ),
            )
        )
        events += 1
        blocks += BLOCKS_PER_EVENT
    for r in range(requests):
        w = r % WORKERS
        batch: list[Any] = []
        parent = system_hashes[-1] if rng.random() < 0.6 else None
        for _ in range(EVENTS_PER_REQUEST):
            hashes = list(range(next_hash[w], next_hash[w] + BLOCKS_PER_EVENT))
            next_hash[w] += BLOCKS_PER_EVENT
            tokens = [rng.randrange(VOCAB) for _ in range(event_tokens)]
            batch.append(stored(encoding, hashes, parent, tokens))
            live[w].append(hashes)
            held[w] += BLOCKS_PER_EVENT
            parent = hashes[-1]
            blocks += BLOCKS_PER_EVENT
        while held[w] > capacity:
            old = live[w].popleft()
            batch.append(removed(encoding, old))
            held[w] -= len(old)
        events += len(batch)
        out.append((w, msgspec.msgpack.encode([time.time(), batch, 0])))
    return out, events, blocks


def ingest(payloads: list[tuple[int, bytes]]) -> tuple[KvIndex, float, float, float]:
    """(index, wall seconds for decode + apply, CPU seconds for the same, CPU seconds for
    decode alone), streaming: each batch is dropped once applied, as in the subscriber. CPU
    time (this process's) is what a shared machine does not inflate: rates per CPU-second are
    what one router process sustains on a core of its own."""
    c0 = time.process_time()
    for _, p in payloads:
        decode_payload(p)
    c1 = time.process_time()
    index = KvIndex()
    t2, c2 = time.perf_counter(), time.process_time()
    for w, p in payloads:
        index.apply_batch(key(w), decode_payload(p).records)
    t3, c3 = time.perf_counter(), time.process_time()
    return index, t3 - t2, c3 - c2, c1 - c0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=12000)
    parser.add_argument("--capacity", type=int, default=4096, help="blocks per worker")
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()

    rows = []
    index = KvIndex()
    for encoding in ("array", "map"):
        payloads, events, blocks = workload(encoding, args.requests, args.capacity)
        index, wall, cpu, dec = ingest(payloads)
        assert index.counters.unknown_parent == 0
        rows.append((encoding, len(payloads), events, blocks, wall, cpu, dec))

    print(
        f"## KV ingestion ({WORKERS} workers, stores of {BLOCKS_PER_EVENT} blocks x {BLOCK} "
        f"tokens, LRU removals past {args.capacity} blocks/worker; block hash in {HASHING})\n"
    )
    print(
        "| encoding | batches | events (stores+removes) | events/CPU-s | blocks stored/CPU-s "
        "| blocks stored/s (wall) | decode % |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for encoding, batches, events, blocks, wall, cpu, dec in rows:
        print(
            f"| {encoding} | {batches} | {events} | {events / cpu:,.0f} | "
            f"{blocks / cpu:,.0f} | {blocks / wall:,.0f} | {dec / cpu:.0%} |"
        )

    # ---- overlaps ------------------------------------------------------------------------
    rng = random.Random(1)
    prompt = [rng.randrange(VOCAB) for _ in range(512 * BLOCK)]
    prompt_hashes = block_hashes(prompt, BLOCK)
    depths = [0, 0, 8, 8, 32, 32, 64, 96, 128, 192, 256, 320, 384, 448, 512, 512]
    rng.shuffle(depths)
    base = 1 << 60
    for w, depth in enumerate(depths):
        if depth:
            index.apply_batch(
                key(w),
                decode_payload(
                    msgspec.msgpack.encode(
                        [
                            0.0,
                            [
                                stored(
                                    "array",
                                    list(range(base, base + depth)),
                                    None,
                                    prompt[: depth * BLOCK],
                                )
                            ],
                            0,
                        ]
                    )
                ).records,
            )
    got = index.overlaps(prompt_hashes)
    assert got == {key(w): d for w, d in enumerate(depths) if d}, got
    realistic = timed(lambda: index.overlaps(prompt_hashes), args.rounds)

    worst = KvIndex()
    for w in range(WORKERS):
        worst.apply_batch(
            key(w),
            decode_payload(
                msgspec.msgpack.encode(
                    [0.0, [stored("array", list(range(base, base + 512)), None, prompt)], 0]
                )
            ).records,
        )
    assert worst.overlaps(prompt_hashes) == {key(w): 512 for w in range(WORKERS)}
    worst_case = timed(lambda: worst.overlaps(prompt_hashes), args.rounds)
    hashing = timed(lambda: block_hashes(prompt, BLOCK), args.rounds)

    print(f"\n## 8k-token prompt (512 blocks), {WORKERS} workers, index of {len(index):,} blocks\n")
    print("| operation | p50 µs | p99 µs |")
    print("|---|---:|---:|")
    print(
        f"| overlaps(), prefixes of 0..512 blocks | {pct(realistic, 0.5):.1f} | "
        f"{pct(realistic, 0.99):.1f} |"
    )
    print(
        f"| overlaps(), all 16 hold all 512 | {pct(worst_case, 0.5):.1f} | "
        f"{pct(worst_case, 0.99):.1f} |"
    )
    print(f"| block_hashes(8192 tokens) | {pct(hashing, 0.5):.1f} | {pct(hashing, 0.99):.1f} |")


if __name__ == "__main__":
    main()
