"""The simulated clock of an engine step: prefill cost by uncached tokens, decode cost by batch.

    prefill_s(u)     = base + per_token * u * (1 + u / superlinear_tokens)   (u: uncached tokens)
    first_token_s(u) = prefill_s(u) + ttft                                   (ttft: a fixed extra)
    decode_step_s(n) = itl * (1 + batch_slowdown * n)                        (n: running requests)

With `prefill_stalls_decode` the engine also models what a prefill does to the batch on one
GPU without chunked prefill: prefills run one at a time, and a decode step due while a
prefill runs waits for it (MockEngine keeps the busy window; this module stays pure).

Every figure is in seconds, already divided by the speedup. Pure functions of their inputs, so
tests check the shape of the curve without sleeping.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Timing:
    ttft_s: float = 0.0
    itl_s: float = 0.0
    prefill_base_s: float = 0.0
    prefill_per_token_s: float = 0.0
    prefill_superlinear_tokens: float = 8192.0
    batch_slowdown: float = 0.0
    prefill_stalls_decode: bool = False

    def prefill_s(self, uncached_tokens: int) -> float:
        """The prefill of `uncached_tokens` tokens (superlinear: attention grows with length)."""
        u = max(0, uncached_tokens)
        return self.prefill_base_s + self.prefill_per_token_s * u * (
            1.0 + u / self.prefill_superlinear_tokens
        )

    def first_token_s(self, uncached_tokens: int) -> float:
        """From admission to the first token: the prefill plus the fixed --ttft-ms."""
        return self.prefill_s(uncached_tokens) + self.ttft_s

    def decode_step_s(self, running_requests: int) -> float:
        """One decode step while `running_requests` requests share the batch."""
        return self.itl_s * (1.0 + self.batch_slowdown * max(0, running_requests))
