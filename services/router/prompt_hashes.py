"""The prompt's block hashes, reusing the hashes of a recent prompt that starts the same way,
and computing the rest only as deep as a lookup reads them.

Hashing is most of a decision's cost for a long prompt (one XXH3 call per block, see
`switchyard.common.block_hash`, whose definition this follows exactly). Consecutive requests
mostly extend or share a recent prompt (a conversation's next turn, a shared system prompt),
so: the prompt's token bytes are compared with the recent prompts that have the same first
block (a binary search of memcmp over whole blocks, microseconds), the hashes of the longest
common run of blocks are reused, and only the rest is hashed, chained from the last reused
one. A small LRU (`entries` first blocks, `per_key` prompts each) bounds the memory.

`blocks()` returns a `PromptBlocks`: the hashes known so far, extended on demand (`upto`).
The index walk reads hashes only while some worker still holds the prefix, and bookings
compare token bytes, so a prompt nobody holds costs one block's hash, not one per block.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from typing import overload

import xxhash

from switchyard.common.block_hash import SEED, chain_hashes, full_block_bytes
from switchyard.router.bookings import common_prefix

_xxh3 = xxhash.xxh3_64_intdigest


class PromptBlocks(Sequence[int]):
    """A prompt's chained block hashes, computed a prefix at a time. `data` holds the full
    blocks' token bytes (`step` bytes each, `len(self)` of them); `known` the leading hashes
    computed so far (at least the first). Reading it as a sequence computes them all."""

    __slots__ = ("data", "step", "known", "_n", "_owner")

    def __init__(
        self, data: bytes, step: int, n: int, known: list[int], owner: PromptHashes
    ) -> None:
        self.data = data
        self.step = step
        self.known = known
        self._n = n
        self._owner = owner

    @property
    def first(self) -> int:
        return self.known[0]

    def upto(self, k: int) -> list[int]:
        """`known`, extended to at least min(k, len(self)) hashes."""
        known = self.known
        have = len(known)
        if have < k:
            k = min(k, self._n)
            if have < k:
                known += chain_hashes(self.data, self.step, have, k, known[-1])
                self._owner.hashed_blocks += k - have
        return known

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if type(i) is int and 0 <= i < len(self.known):
            return self.known[i]
        return self.upto(self._n)[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self.upto(self._n))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PromptBlocks):
            other = other.upto(len(other))
        return self.upto(self._n) == other

    __hash__ = None  # type: ignore[assignment]


class PromptHashes:
    def __init__(self, entries: int = 256, per_key: int = 4) -> None:
        self._entries = entries
        self._per_key = per_key
        # (block size, first block hash) -> recent prompts' blocks, most recent first
        self._lru: collections.OrderedDict[tuple[int, int], list[PromptBlocks]] = (
            collections.OrderedDict()
        )
        self.reused_blocks = 0
        self.hashed_blocks = 0

    def hashes(self, token_ids: Sequence[int], block_size: int) -> list[int]:
        """The chained hashes of the full blocks (as block_hashes(token_ids, block_size))."""
        blocks = self.blocks(token_ids, block_size)
        return list(blocks.upto(len(blocks))) if blocks else []

    def blocks(self, token_ids: Sequence[int], block_size: int) -> PromptBlocks:
        """The prompt's blocks, with the hashes a recent prompt shares already known."""
        data, n = full_block_bytes(token_ids, block_size)
        step = block_size * 4
        if n == 0:
            return PromptBlocks(data, step, 0, [], self)
        first = _xxh3(data[:step], SEED)
        key = (block_size, first)
        recent = self._lru.get(key)
        reuse: list[int] = [first]
        if recent is not None:
            self._lru.move_to_end(key)
            two = data[: 2 * step]  # most recent prompts part from this one at block 1
            for other in recent:
                if not other.data.startswith(two):
                    continue  # (they share block 0 only: nothing to reuse)
                known = other.known
                # block 0 is shared (the same key); no further than `other` is hashed
                common = common_prefix(data, other.data, step, 1, min(n, len(known)))
                if common > len(reuse):
                    reuse = known[:common]
        self.reused_blocks += len(reuse) - 1
        self.hashed_blocks += 1
        blocks = PromptBlocks(data, step, n, reuse, self)  # reuse: a list of its own
        self._remember(key, blocks)
        return blocks

    def _remember(self, key: tuple[int, int], blocks: PromptBlocks) -> None:
        recent = self._lru.get(key)
        if recent is None:
            recent = self._lru[key] = []
            while len(self._lru) > self._entries:
                self._lru.popitem(last=False)
        # A prompt that extends a remembered one replaces it (a conversation's next turn).
        data = blocks.data
        kept = [b for b in recent if not (len(b.data) <= len(data) and data.startswith(b.data))]
        recent[:] = kept[: self._per_key - 1]
        recent.insert(0, blocks)
