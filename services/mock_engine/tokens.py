"""The deterministic next-token function: pure, incremental, the same on every mock engine.

A context (prompt + output so far) is folded token by token into a 64-bit state
(`absorb`); the next token is drawn from the state alone (`TokenOracle.pick`). So one
context gives one next token on every engine, and a request resumed elsewhere with
prompt + partial output as its prompt continues exactly as if it had not been interrupted.
Sampling with temperature > 0 mixes a per-request salt (from the seed) into the draw.

Hot path: integer ops only, no I/O, no allocation beyond ints.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

MASK64 = (1 << 64) - 1
INITIAL_STATE = 0x243F6A8885A308D3  # the state of the empty context
_GOLDEN = 0x9E3779B97F4A7C15
_DRAW_KEY = 0xD1B54A32D192ED03
_SEED_KEY = 0x8CB92BA72F3D8DD7
EOS_ONE_IN = 40  # once EOS may be emitted, about one position in this many emits it


def mix64(value: int) -> int:
    """SplitMix64's finalizer: a bijective avalanche of a 64-bit int."""
    value &= MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK64
    return value ^ (value >> 31)


def absorb(state: int, token_id: int) -> int:
    """The state of `context + [token_id]` from the state of `context`."""
    return mix64(((state ^ token_id) + _GOLDEN) & MASK64)


def absorb_all(tokens: Iterable[int], state: int = INITIAL_STATE) -> int:
    for token_id in tokens:
        state = mix64(((state ^ token_id) + _GOLDEN) & MASK64)
    return state


def salt_for_seed(seed: int) -> int:
    """The draw salt of a sampled request with this seed (0 is reserved for greedy)."""
    return mix64((seed & MASK64) ^ _SEED_KEY) | 1


class TokenOracle:
    """Picks the next token from a context state; holds only the vocabulary facts."""

    __slots__ = ("ordinary_ids", "eos_token_id", "_count")

    def __init__(self, ordinary_ids: Sequence[int], eos_token_id: int) -> None:
        if not ordinary_ids:
            raise ValueError("ordinary_ids must not be empty")
        self.ordinary_ids = tuple(ordinary_ids)
        self.eos_token_id = eos_token_id
        self._count = len(self.ordinary_ids)

    def pick(
        self,
        state: int,
        *,
        salt: int = 0,
        allow_eos: bool = True,
        banned: Collection[int] = (),
    ) -> int:
        """The next token for a context in `state`.

        `salt` is 0 for greedy decoding, a seed's salt when sampling. `allow_eos` false (min
        tokens not reached, or ignore_eos) puts the ordinary token of the same draw where EOS
        would have been. `banned` ids (stop tokens before min tokens is reached) are skipped
        by re-drawing deterministically.
        """
        draw = mix64(state ^ _DRAW_KEY ^ salt)
        if allow_eos and (draw >> 40) % EOS_ONE_IN == 0:
            return self.eos_token_id
        token = self.ordinary_ids[draw % self._count]
        if not banned or token not in banned:
            return token
        for attempt in range(1, 65):
            draw = mix64(draw + attempt)
            token = self.ordinary_ids[draw % self._count]
            if token not in banned:
                return token
        start = draw % self._count  # pathological ban lists: scan for any allowed id
        for offset in range(self._count):
            token = self.ordinary_ids[(start + offset) % self._count]
            if token not in banned:
                return token
        return self.ordinary_ids[start]
