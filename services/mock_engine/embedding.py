"""Deterministic embeddings for the mock engine's embedding mode (`--embedding`).

A text's vector is the L2-normalized sum of fixed pseudo-random vectors of its tokens (a bag
of tokens), so the same input always gives the same vector, on every mock engine, and inputs
that share tokens are closer (cosine) than inputs that share none. Components are float32, as
the engines' proto floats are. Per-token vectors are cached: a vocabulary's worth is a few MB.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from switchyard.mock_engine.tokens import MASK64, mix64

_EMBED_KEY = 0x510E527FADE682D1


@functools.lru_cache(maxsize=65536)
def _token_vector(token_id: int, dimensions: int) -> tuple[float, ...]:
    """Components in [-1, 1), four 16-bit draws per mixed 64-bit word."""
    out: list[float] = []
    word = mix64((token_id * 0x9E3779B97F4A7C15 + _EMBED_KEY) & MASK64)
    while len(out) < dimensions:
        word = mix64((word + 0x632BE59BD9B4E019) & MASK64)
        for shift in (0, 16, 32, 48):
            out.append(((word >> shift) & 0xFFFF) / 32768.0 - 1.0)
    return tuple(out[:dimensions])


def embed(token_ids: Sequence[int], dimensions: int) -> list[float]:
    """The unit vector of an input (at least one token)."""
    total = [0.0] * dimensions
    for token in token_ids:
        for i, value in enumerate(_token_vector(token, dimensions)):
            total[i] += value
    norm = math.sqrt(sum(v * v for v in total)) or 1.0
    return [v / norm for v in total]
