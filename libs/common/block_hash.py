"""The router's own content hash of KV blocks: one definition shared by the request path and
the KV-event index, so a prompt's blocks and an engine's stored blocks meet on the same keys.

Definition (the field's convention: XXH3-64, seed 1337, token ids as little-endian u32):

    tokens(b)  = the block's token ids, each as 4 little-endian bytes (u32)
    h(b0)      = XXH3_64(tokens(b0), seed=1337)                          # a chain's first block
    h(bi)      = XXH3_64(h(b(i-1)) as 8 little-endian bytes || tokens(bi), seed=1337)

So a root block has no prefix (not a zero parent), and every other block's hash covers its
whole prefix. Only full blocks are hashed; a trailing partial block is ignored. Hashes are
unsigned 64-bit ints.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

import xxhash

SEED = 1337

_xxh3 = xxhash.xxh3_64_intdigest

if array("I").itemsize != 4:  # pragma: no cover - every supported platform has a 4-byte uint
    raise ImportError("block_hash needs array('I') to be 32 bits wide")
_BIG_ENDIAN_HOST = sys.byteorder == "big"


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int | None = None) -> list[int]:
    """Chained hashes of the full blocks of `token_ids`, in order.

    `parent` continues an existing chain: the first block is hashed as the child of `parent`
    (the u64 router hash of the block before it) instead of as a root. Raises ValueError for
    a block_size below 1 or a token id outside u32.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n = len(token_ids) // block_size
    if n == 0:
        return []
    full = n * block_size
    try:
        data = array("I", token_ids if len(token_ids) == full else token_ids[:full]).tobytes()
    except OverflowError as exc:
        raise ValueError("token ids must fit in an unsigned 32-bit int") from exc
    if _BIG_ENDIAN_HOST:  # pragma: no cover - the wire order is little-endian everywhere
        swapped = array("I", data)
        swapped.byteswap()
        data = swapped.tobytes()
    step = block_size * 4
    out: list[int] = []
    append = out.append
    h = parent
    for start in range(0, n * step, step):
        chunk = data[start : start + step]
        h = _xxh3(chunk, SEED) if h is None else _xxh3(h.to_bytes(8, "little") + chunk, SEED)
        append(h)
    return out


def block_hash(token_ids: Sequence[int], parent: int | None = None) -> int:
    """Hash of one block (all of `token_ids`), chained to `parent` (None: a root block)."""
    hashes = block_hashes(token_ids, max(len(token_ids), 1), parent)
    if not hashes:
        raise ValueError("a block needs at least one token")
    return hashes[0]
