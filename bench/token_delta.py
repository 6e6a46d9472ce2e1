"""Encode/decode cost of the dispatcher's per-token replies: does carrying logprobs (and the
choice index) in TokenDelta slow the common case that asks for none?

Compares, in one run, a batch of one-token TokenDeltas as the dispatcher sends them (a msgpack
array per flush, decoded with the reply union's decoder):
  - `before`: the two-field TokenDelta that preceded the logprob fields (a local copy),
  - `no logprobs`: today's TokenDelta with its optional fields left unset,
  - `logprobs, top 0` / `top 5`: the same with a TokenLogprobs per delta.

    python bench/token_delta.py                # batches of 64 deltas, best of 5 x 10000
    python bench/token_delta.py --batch 8 --rounds 50000
"""

from __future__ import annotations

import argparse
import time

import msgspec

from switchyard.protos import codec
from switchyard.protos.messages import (
    DeltaDetail,
    GenerateFailed,
    GenerateFinished,
    TokenDelta,
    TokenLogprobs,
)


class OldTokenDelta(msgspec.Struct, frozen=True, array_like=True, tag="d"):
    request_id: str
    token_ids: list[int]


OLD_DECODER = msgspec.msgpack.Decoder(list[OldTokenDelta | GenerateFinished | GenerateFailed])


def batches(batch: int) -> dict[str, tuple[list[object], msgspec.msgpack.Decoder]]:
    rids = [f"chatcmpl-{i:032x}" for i in range(batch)]
    top0 = DeltaDetail(logprobs=TokenLogprobs([-0.25]))
    top5 = DeltaDetail(
        logprobs=TokenLogprobs(
            [-0.25],
            [[1201, 88, 4005, 912, 77]],
            [[-0.25, -1.75, -2.5, -3.0, -4.125]],
        )
    )
    return {
        "before": ([OldTokenDelta(r, [12345]) for r in rids], OLD_DECODER),
        "no logprobs": ([TokenDelta(r, [12345]) for r in rids], codec.dispatcher_replies),
        "logprobs, top 0": (
            [TokenDelta(r, [12345], top0) for r in rids],
            codec.dispatcher_replies,
        ),
        "logprobs, top 5": (
            [TokenDelta(r, [12345], top5) for r in rids],
            codec.dispatcher_replies,
        ),
    }


def measure(
    replies: list[object], decoder: msgspec.msgpack.Decoder, rounds: int
) -> tuple[float, float, int]:
    """ns per delta to encode and to decode, and bytes per delta."""
    encode = codec.encode
    data = encode(replies)
    start = time.perf_counter_ns()
    for _ in range(rounds):
        encode(replies)
    encoded = time.perf_counter_ns() - start
    decode = decoder.decode
    start = time.perf_counter_ns()
    for _ in range(rounds):
        decode(data)
    decoded = time.perf_counter_ns() - start
    count = rounds * len(replies)
    return encoded / count, decoded / count, len(data) // len(replies)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="deltas per ZMQ message")
    parser.add_argument("--rounds", type=int, default=10000, help="per pass (5 passes)")
    args = parser.parse_args()
    cases = batches(args.batch)
    results: dict[str, tuple[float, float, int]] = {}
    for _ in range(5):  # the best of 5 passes, each case interleaved with the others
        for name, (replies, decoder) in cases.items():
            enc, dec, size = measure(replies, decoder, args.rounds)
            best = results.get(name, (enc, dec, size))
            results[name] = (min(enc, best[0]), min(dec, best[1]), size)
    base_enc, base_dec, _ = results["before"]
    print(f"TokenDelta codec, batches of {args.batch}, {args.rounds} rounds\n")
    print("| case | encode ns/delta | decode ns/delta | vs before (enc / dec) | bytes/delta |")
    print("|---|---|---|---|---|")
    for name, (enc, dec, size) in results.items():
        print(
            f"| {name} | {enc:.0f} | {dec:.0f} | {enc / base_enc:.2f} / {dec / base_dec:.2f} "
            f"| {size} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
