"""The router's own content hash of KV blocks: one definition shared by the request path and
the KV-event index, so a prompt's blocks and an engine's stored blocks meet on the same keys.

Definition (the field's convention: XXH3-64, seed 1337, token ids as little-endian u32):

    tokens(b)  = the block's token ids, each as 4 little-endian bytes (u32)
    h(b0)      = XXH3_64(tokens(b0), seed=1337)                          # a chain's first block
    h(bi)      = XXH3_64(h(b(i-1)) as 8 little-endian bytes || tokens(bi), seed=1337)

So a root block has no prefix (not a zero parent), and every other block's hash covers its
whole prefix. Only full blocks are hashed; a trailing partial block is ignored. Hashes are
unsigned 64-bit ints.

`block_hashes` and `chain_hashes` are the C extension's (`_blockhash`, built at install
time) when it imported, else the Python definitions below (`py_block_hashes`,
`py_chain_hashes`: the fallback, and the reference the extension is tested against).
`NATIVE` says which is live.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

import xxhash

from switchyard.common.native import load

# The C extension, unless not built or turned off (SWITCHYARD_NATIVE=0, common/native.py).
native: Any = load("switchyard.common._blockhash")

SEED = 1337
NATIVE = native is not None

_xxh3 = xxhash.xxh3_64_intdigest

if array("I").itemsize != 4:  # pragma: no cover - every supported platform has a 4-byte uint
    raise ImportError("block_hash needs array('I') to be 32 bits wide")
_BIG_ENDIAN_HOST = sys.byteorder == "big"


def py_block_hashes(
    token_ids: Sequence[int], block_size: int, parent: int | None = None
) -> list[int]:
    """Chained hashes of the full blocks of `token_ids`, in order.

    `parent` continues an existing chain: the first block is hashed as the child of `parent`
    (the u64 router hash of the block before it) instead of as a root. Raises ValueError for
    a block_size below 1 or a token id outside u32.
    """
    data, n = full_block_bytes(token_ids, block_size)
    return py_chain_hashes(data, block_size * 4, 0, n, parent)


def full_block_bytes(token_ids: Sequence[int], block_size: int) -> tuple[bytes, int]:
    """The hashed bytes of the full blocks of `token_ids` (u32 little-endian each) and how
    many full blocks there are. ValueError for a block_size below 1 or an id outside u32."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n = len(token_ids) // block_size
    if n == 0:
        return b"", 0
    full = n * block_size
    tokens = token_ids if len(token_ids) == full else token_ids[:full]
    try:
        if type(tokens) is list:
            # fromlist reads the list's items directly: about a third fewer instructions per
            # token than array("I", list), which goes through the sequence protocol per item.
            packed = array("I")
            packed.fromlist(tokens)
        else:
            packed = array("I", tokens)
        data = packed.tobytes()
    except OverflowError as exc:
        raise ValueError("token ids must fit in an unsigned 32-bit int") from exc
    if _BIG_ENDIAN_HOST:  # pragma: no cover - the wire order is little-endian everywhere
        swapped = array("I", data)
        swapped.byteswap()
        data = swapped.tobytes()
    return data, n


def py_chain_hashes(data: bytes, step: int, start: int, n: int, parent: int | None) -> list[int]:
    """Hashes of blocks start..n-1 of `data` (blocks of `step` bytes), chained from `parent`
    (None: block `start` is a root)."""
    out: list[int] = []
    append = out.append
    h = parent
    for offset in range(start * step, n * step, step):
        chunk = data[offset : offset + step]
        h = _xxh3(chunk, SEED) if h is None else _xxh3(h.to_bytes(8, "little") + chunk, SEED)
        append(h)
    return out


block_hashes = native.block_hashes if native is not None else py_block_hashes
chain_hashes = native.chain_hashes if native is not None else py_chain_hashes


def block_hash(token_ids: Sequence[int], parent: int | None = None) -> int:
    """Hash of one block (all of `token_ids`), chained to `parent` (None: a root block)."""
    hashes = block_hashes(token_ids, max(len(token_ids), 1), parent)
    if not hashes:
        raise ValueError("a block needs at least one token")
    return hashes[0]
