"""The prompt's block hashes, reusing the hashes of a recent prompt that starts the same way.

Hashing is most of a decision's cost for a long prompt (one XXH3 call per block, see
`switchyard.common.block_hash`, whose definition this follows exactly). Consecutive requests
mostly extend or share a recent prompt (a conversation's next turn, a shared system prompt),
so: the prompt's token bytes are compared with the recent prompts that have the same first
block (a binary search of memcmp over whole blocks, microseconds), the hashes of the longest
common run of blocks are reused, and only the rest is hashed, chained from the last reused
one. A small LRU (`entries` first blocks, `per_key` prompts each) bounds the memory.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import xxhash

from switchyard.common.block_hash import SEED, chain_hashes, full_block_bytes

_xxh3 = xxhash.xxh3_64_intdigest


class PromptHashes:
    def __init__(self, entries: int = 256, per_key: int = 4) -> None:
        self._entries = entries
        self._per_key = per_key
        # (block size, first block hash) -> [(token bytes, hashes)], most recent first
        self._lru: collections.OrderedDict[tuple[int, int], list[tuple[bytes, list[int]]]] = (
            collections.OrderedDict()
        )
        self.reused_blocks = 0
        self.hashed_blocks = 0

    def hashes(self, token_ids: Sequence[int], block_size: int) -> list[int]:
        """The chained hashes of the full blocks (as block_hashes(token_ids, block_size))."""
        data, n = full_block_bytes(token_ids, block_size)
        if n == 0:
            return []
        step = block_size * 4
        first = _xxh3(data[:step], SEED)
        key = (block_size, first)
        recent = self._lru.get(key)
        reuse: list[int] = [first]
        if recent is not None:
            self._lru.move_to_end(key)
            for other, other_hashes in recent:
                common = self._common_blocks(data, memoryview(other), step, n, len(other_hashes))
                if common > len(reuse):
                    reuse = other_hashes[:common]
        done = len(reuse)
        hashes = reuse + chain_hashes(data, step, done, n, reuse[-1]) if done < n else reuse[:n]
        self.reused_blocks += done - 1
        self.hashed_blocks += n - done + 1
        self._remember(key, data, hashes)
        return hashes

    @staticmethod
    def _common_blocks(a: bytes, b: memoryview, step: int, n: int, m: int) -> int:
        """How many leading whole blocks two token byte strings share (block 0 is shared)."""
        low, high = 1, min(n, m)  # low blocks known equal; find the largest equal prefix
        while low < high:
            mid = (low + high + 1) // 2
            if a.startswith(b[: mid * step]):  # memcmp, no copy
                low = mid
            else:
                high = mid - 1
        return low

    def _remember(self, key: tuple[int, int], data: bytes, hashes: list[int]) -> None:
        recent = self._lru.get(key)
        if recent is None:
            recent = self._lru[key] = []
            while len(self._lru) > self._entries:
                self._lru.popitem(last=False)
        # A prompt that extends a remembered one replaces it (a conversation's next turn).
        recent[:] = [(d, h) for d, h in recent if not (len(d) <= len(data) and data.startswith(d))][
            : self._per_key - 1
        ]
        recent.insert(0, (data, hashes))
