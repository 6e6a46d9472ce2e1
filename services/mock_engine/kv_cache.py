"""The simulated KV prefix cache: full blocks under chained engine hashes, pinned while a
request holds them, evicted least recently used, leaves first.

Hash (the engine's own, opaque to the router): a block's id is blake2b with an 8-byte digest,
keyed with the engine's 64-bit seed, over the parent's id as 8 big-endian bytes (nothing for
block 0) followed by the block's token ids as little-endian u32; read big-endian as an
unsigned 64-bit int, so about half the ids exceed 2^63. The seed is per engine (random unless
--kv-hash-seed is given), so two engines name the same content differently, as vLLM does
without PYTHONHASHSEED.

Matching (`begin`): the prompt's full blocks are looked up from block 0 until the first miss,
over at most len(prompt) - 1 tokens (an engine computes at least the last prompt token to
sample from it), so a prompt whose length is a multiple of the block size always recomputes
its last block. Matched blocks are pinned for the request's lifetime; `cached_tokens` is their
token count.

Holding (`hold`): a finished prefill's blocks stay pinned (a lease of their own, released like
any other) until a decode engine has taken them over.

Storing (`commit`): every full block of the request's computed tokens not yet held is stored
and pinned, as one BlockStored event per unbroken run, preceded by one BlockRemoved event for
what had to be evicted to make room. A block that is already cached (recomputed: the
repeated prompt's last block, or a concurrent request's) is reused silently under the SGLang
policy; under the vLLM policy it is stored again as a second physical copy, with its own
BlockStored, and each copy later gets its own BlockRemoved (at most two copies).

Eviction: only unpinned leaves (no cached child) are candidates, the least recently used first
(a block is used when matched, stored or released). A parent becomes a candidate when its last
child goes, so a removal never orphans a cached child and every chain stays rooted. A
duplicated block loses a copy first (one BlockRemoved), then itself. When every block is pinned
the store stops at that block: the rest of the chain stays uncached and the request runs on.

Capacity is `num_blocks` physical blocks (copies count). Pure bookkeeping: no I/O, no clock (a
tick counter orders uses).
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import sys
from array import array
from collections.abc import Sequence

from switchyard.mock_engine.types import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

MAX_COPIES = 2  # vLLM keeps at most two physical copies of one hash
_BIG_ENDIAN_HOST = sys.byteorder == "big"


@dataclasses.dataclass(frozen=True, slots=True)
class CachePolicy:
    """What differs between the engine families' caches."""

    duplicate_recomputed: bool  # vLLM: a recomputed cached block is stored again (a copy)
    store_output_each_step: bool  # vLLM: output blocks as they fill; SGLang: at the end


VLLM_POLICY = CachePolicy(duplicate_recomputed=True, store_output_each_step=True)
SGLANG_POLICY = CachePolicy(duplicate_recomputed=False, store_output_each_step=False)


class EngineHasher:
    """The engine's block ids: keyed blake2b-64 chained over the parent id (see module doc)."""

    __slots__ = ("seed", "_key")

    def __init__(self, seed: int) -> None:
        if not 0 <= seed < 1 << 64:
            raise ValueError(f"hash seed must be an unsigned 64-bit int, got {seed}")
        self.seed = seed
        self._key = seed.to_bytes(8, "big")

    def block(self, parent: int | None, tokens: Sequence[int]) -> int:
        digest = hashlib.blake2b(digest_size=8, key=self._key)
        if parent is not None:
            digest.update(parent.to_bytes(8, "big"))
        words = array("I", tokens)  # u32 (every supported platform); little-endian below
        if _BIG_ENDIAN_HOST:  # pragma: no cover - x86 and arm64 are little-endian
            words.byteswap()
        digest.update(words.tobytes())
        return int.from_bytes(digest.digest(), "big")

    def chain(self, tokens: Sequence[int], block_size: int, parent: int | None = None) -> list[int]:
        """The ids of every full block of `tokens`, chained from `parent`."""
        out: list[int] = []
        for start in range(0, len(tokens) - block_size + 1, block_size):
            parent = self.block(parent, tokens[start : start + block_size])
            out.append(parent)
        return out


class _Block:
    __slots__ = ("block_hash", "parent", "tokens", "children", "refs", "copies", "tick")

    def __init__(self, block_hash: int, parent: int | None, tokens: tuple[int, ...]) -> None:
        self.block_hash = block_hash
        self.parent = parent
        self.tokens = tokens
        self.children = 0  # cached blocks whose parent this is
        self.refs = 0  # running requests holding it
        self.copies = 1
        self.tick = 0


class Lease:
    """One request's hold on the cache: its chain of full-block ids and how many it pins."""

    __slots__ = ("hashes", "held", "cached_tokens", "stopped")

    def __init__(self, hashes: list[int], held: int, cached_tokens: int) -> None:
        self.hashes = hashes  # ids of the full blocks hashed so far (prompt, then output)
        self.held = held  # hashes[:held] are pinned by this request
        self.cached_tokens = cached_tokens
        self.stopped = False  # released, or a store found no room: store nothing more


class PrefixCache:
    def __init__(
        self, *, block_size: int, num_blocks: int, hasher: EngineHasher, policy: CachePolicy
    ) -> None:
        if block_size < 1 or num_blocks < 1:
            raise ValueError("block_size and num_blocks must be at least 1")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.hasher = hasher
        self.policy = policy
        self._blocks: dict[int, _Block] = {}
        self._heap: list[tuple[int, int]] = []  # (tick, hash) of eviction candidates, lazily
        self._tick = 0
        self._used = 0  # physical blocks, copies included
        self._pinned = 0  # distinct blocks with refs > 0
        self._prompt_tokens = 0
        self._hit_tokens = 0

    # -- figures ---------------------------------------------------------------------------

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def used_blocks(self) -> int:
        return self._used

    @property
    def pinned_blocks(self) -> int:
        return self._pinned

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    @property
    def hit_rate(self) -> float:
        return self._hit_tokens / self._prompt_tokens if self._prompt_tokens else 0.0

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def copies(self, block_hash: int) -> int:
        block = self._blocks.get(block_hash)
        return 0 if block is None else block.copies

    def refs(self, block_hash: int) -> int:
        block = self._blocks.get(block_hash)
        return 0 if block is None else block.refs

    def match_tokens(self, prompt: Sequence[int]) -> int:
        """How many prompt tokens `begin` would serve from the cache now (pins nothing)."""
        matched = 0
        limit = (len(prompt) - 1) // self.block_size
        for block_hash in self.hasher.chain(prompt[: limit * self.block_size], self.block_size):
            if block_hash not in self._blocks:
                break
            matched += 1
        return matched * self.block_size

    # -- a request's life ------------------------------------------------------------------

    def begin(self, prompt: Sequence[int]) -> Lease:
        """Match the prompt's full blocks from block 0 and pin the hits."""
        hashes = self.hasher.chain(prompt, self.block_size)
        limit = (len(prompt) - 1) // self.block_size
        matched = 0
        for block_hash in hashes[:limit]:
            block = self._blocks.get(block_hash)
            if block is None:
                break
            self._pin(block)
            matched += 1
        cached = matched * self.block_size
        self._prompt_tokens += len(prompt)
        self._hit_tokens += cached
        return Lease(hashes, matched, cached)

    def hold(self, tokens: Sequence[int]) -> Lease:
        """Pin the cached full blocks of `tokens` from block 0 (every full block, the last one
        included) until the first miss: KV kept for a handover. No hit statistics."""
        hashes = self.hasher.chain(tokens, self.block_size)
        held = 0
        for block_hash in hashes:
            block = self._blocks.get(block_hash)
            if block is None:
                break
            self._pin(block)
            held += 1
        return Lease(hashes, held, held * self.block_size)

    def commit(self, lease: Lease, tokens: Sequence[int], computed: int) -> list[KvEvent]:
        """Store and pin the full blocks of `tokens[:computed]` the lease does not hold yet."""
        size = self.block_size
        full = min(computed, len(tokens)) // size
        if lease.stopped or full <= lease.held:
            return []
        hashes = lease.hashes
        while len(hashes) < full:
            index = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(self.hasher.block(parent, tokens[index * size : (index + 1) * size]))
        removed: list[int] = []
        stored: list[KvEvent] = []
        run: list[int] = []
        run_parent: int | None = None
        for index in range(lease.held, full):
            block_hash = hashes[index]
            parent = hashes[index - 1] if index else None
            block = self._blocks.get(block_hash)
            if block is None:
                if not self._make_room(removed):
                    lease.stopped = True
                    break
                block = _Block(block_hash, parent, tuple(tokens[index * size : (index + 1) * size]))
                self._blocks[block_hash] = block
                self._used += 1
                if parent is not None:
                    self._blocks[parent].children += 1
                self._pin(block)
                fresh = True
            else:
                self._pin(block)  # before making room: the copy must not evict its original
                fresh = (
                    self.policy.duplicate_recomputed
                    and block.copies < MAX_COPIES
                    and self._make_room(removed)
                )
                if fresh:
                    block.copies += 1
                    self._used += 1
            lease.held = index + 1
            if fresh:
                if not run:
                    run_parent = parent
                run.append(block_hash)
            elif run:
                stored.append(self._stored_event(run, run_parent))
                run = []
        if run:
            stored.append(self._stored_event(run, run_parent))
        if removed:
            return [BlockRemoved(tuple(removed)), *stored]
        return stored

    def release(self, lease: Lease) -> None:
        """Unpin what the lease holds (root first, so its leaves are the most recent)."""
        for block_hash in lease.hashes[: lease.held]:
            block = self._blocks.get(block_hash)
            if block is None:  # pragma: no cover - pinned blocks are never evicted
                continue
            block.refs -= 1
            block.tick = self._next_tick()
            if block.refs == 0:
                self._pinned -= 1
                if block.children == 0:
                    self._push(block)
        lease.held = 0
        lease.stopped = True

    def clear(self) -> list[KvEvent] | None:
        """Drop every block (AllBlocksCleared); None while a request holds any."""
        if self._pinned:
            return None
        self._blocks.clear()
        self._heap.clear()
        self._used = 0
        return [AllBlocksCleared()]

    # -- internals -------------------------------------------------------------------------

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def _pin(self, block: _Block) -> None:
        if block.refs == 0:
            self._pinned += 1
        block.refs += 1
        block.tick = self._next_tick()

    def _push(self, block: _Block) -> None:
        heapq.heappush(self._heap, (block.tick, block.block_hash))
        if len(self._heap) > 4 * self.num_blocks + 64:
            self._heap = [
                (b.tick, b.block_hash)
                for b in self._blocks.values()
                if b.refs == 0 and b.children == 0
            ]
            heapq.heapify(self._heap)

    def _stored_event(self, run: list[int], parent: int | None) -> BlockStored:
        tokens = tuple(t for block_hash in run for t in self._blocks[block_hash].tokens)
        return BlockStored(tuple(run), parent, tokens, self.block_size)

    def _make_room(self, removed: list[int]) -> bool:
        while self._used >= self.num_blocks:
            evicted = self._evict_one()
            if evicted is None:
                return False
            removed.append(evicted)
        return True

    def _evict_one(self) -> int | None:
        """Evict one copy of the least recently used unpinned leaf; its hash, or None."""
        heap = self._heap
        while heap:
            tick, block_hash = heapq.heappop(heap)
            block = self._blocks.get(block_hash)
            if block is None or block.tick != tick or block.refs or block.children:
                continue  # stale entry
            self._used -= 1
            if block.copies > 1:
                block.copies -= 1
                heapq.heappush(heap, (tick, block_hash))
                return block_hash
            del self._blocks[block_hash]
            if block.parent is not None:
                parent = self._blocks[block.parent]
                parent.children -= 1
                if parent.children == 0 and parent.refs == 0:
                    self._push(parent)
            return block_hash
        return None
