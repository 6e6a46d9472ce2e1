"""Scorer: rendezvous (highest random weight) hashing of a key over the candidates: each
worker's score is a hash of (key, worker) in [0, 1), so the top one is the same worker for a
key as long as it stays a candidate, and only its keys move when a worker comes or goes.
The key is the session when there is one, else the prompt's first `prefix_blocks` blocks
(requests sharing a system prompt meet on one worker without any KV view)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from switchyard.common.block_hash import block_hashes
from switchyard.router.types import Needs, PluginDeps, RouteContext, Worker

_SCALE = 1.0 / 2**64


@dataclass(frozen=True, slots=True)
class ConsistentHashParams:
    prefix_blocks: int = 4

    def __post_init__(self) -> None:
        if self.prefix_blocks < 1:
            raise ValueError(f"prefix_blocks must be >= 1, got {self.prefix_blocks}")


class ConsistentHash:
    name = "consistent_hash"
    needs = Needs.SESSION
    Params = ConsistentHashParams

    def __init__(self, params: ConsistentHashParams, deps: PluginDeps) -> None:
        self.params = params

    def key(self, ctx: RouteContext, block_size: int) -> bytes:
        if ctx.session is not None:
            return b"s" + ctx.session.encode("utf-8", "replace")
        tokens = ctx.request.token_ids[: self.params.prefix_blocks * block_size]
        hashes = block_hashes(tokens, block_size) or block_hashes(tokens, max(len(tokens), 1))
        return b"p" + (hashes[-1] if hashes else 0).to_bytes(8, "little")

    def score(self, ctx: RouteContext, workers: Sequence[Worker]) -> list[float]:
        key = self.key(ctx, workers[0].instance.block_size)
        digest = xxhash.xxh3_64_intdigest
        return [
            digest(key + w.key[0].to_bytes(8, "little") + w.key[1].to_bytes(4, "little")) * _SCALE
            for w in workers
        ]
