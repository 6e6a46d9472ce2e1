"""The mock engine's next-token distribution: logprobs and logit_bias on top of `tokens`.

For a context state the distribution is sparse and deterministic: `CANDIDATES` tokens with
strictly falling logits, led by the token the oracle draws (its logit 0), then alternatives
drawn from the state alone (the same for every sample of that context); every other token of
the vocabulary sits at a floor below them. logit_bias adds to a token's logit (a candidate's,
or the floor for any other token), and the emitted token is the argmax of the biased logits
among the allowed tokens: +100 forces a token, -100 bans it. Logprobs are log-softmax over the
whole vocabulary of the biased logits, so the emitted token is always the most likely one and
its top list ranks the others as the engines' do (most likely first).

A token that constrained or scripted output dictates leads its own table (no bias): it is the
argmax by construction, and its alternatives are the context's as usual.

Only requests that ask for logprobs or logit_bias run this; the plain path is `tokens` alone.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from switchyard.mock_engine.tokens import INITIAL_STATE, MASK64, TokenOracle, absorb, mix64
from switchyard.mock_engine.types import Scored

CANDIDATES = 20  # the tokens with a logit of their own per context (vLLM's max logprobs)
_ALT_KEY = 0x6A09E667F3BCC909
_GAP_MIN, _GAP_SPAN = 0.25, 1.5  # logit steps between neighbouring candidates
_FLOOR_GAP = 2.0  # the rest of the vocabulary, below the last candidate


class Distribution:
    __slots__ = ("oracle", "vocab_size", "_ordinary", "_count")

    def __init__(self, oracle: TokenOracle, vocab_size: int) -> None:
        self.oracle = oracle
        self.vocab_size = vocab_size
        self._ordinary = oracle.ordinary_ids
        self._count = len(self._ordinary)

    def _table(self, state: int, first: int, banned: Collection[int]) -> list[tuple[int, float]]:
        """(token, logit) of the candidates: `first` at 0, then alternatives of the state."""
        table = [(first, 0.0)]
        seen = {first}
        logit = 0.0
        draw = mix64(state ^ _ALT_KEY)
        wanted = min(CANDIDATES, self._count)
        for attempt in range(8 * CANDIDATES):
            if len(table) >= wanted:
                break
            draw = mix64((draw + attempt) & MASK64)
            token = self._ordinary[draw % self._count]
            if token in seen or token in banned:
                continue
            seen.add(token)
            logit -= _GAP_MIN + ((draw >> 40) & 0xFFFF) / 65536.0 * _GAP_SPAN
            table.append((token, logit))
        return table

    def _biased(
        self,
        table: list[tuple[int, float]],
        bias: Mapping[int, float],
        allowed: Collection[int] | None = None,
    ) -> tuple[dict[int, float], float]:
        """Biased logits of the candidates and of every biased token, and the floor."""
        floor = table[-1][1] - _FLOOR_GAP
        logits = dict(table)
        for token, value in bias.items():
            if allowed is not None and token not in allowed:
                continue
            logits[token] = logits.get(token, floor) + value
        return logits, floor

    def _usable(
        self, bias: Mapping[int, float], banned: Collection[int], allow_eos: bool
    ) -> set[int]:
        eos = self.oracle.eos_token_id
        return {t for t in bias if t not in banned and (allow_eos or t != eos)}

    def _normalizer(self, logits: Mapping[int, float], floor: float) -> float:
        top = max(max(logits.values()), floor)
        rest = max(0, self.vocab_size - len(logits))
        total = sum(math.exp(value - top) for value in logits.values())
        total += rest * math.exp(floor - top)
        return top + math.log(total)

    def choose(
        self,
        state: int,
        *,
        salt: int,
        allow_eos: bool,
        banned: Collection[int],
        bias: Mapping[int, float],
    ) -> int:
        """The emitted token under logit_bias: the argmax of the biased logits among the
        tokens allowed here (not banned; EOS only when `allow_eos`); ties keep the rank."""
        first = self.oracle.pick(state, salt=salt, allow_eos=allow_eos, banned=banned)
        usable = self._usable(bias, banned, allow_eos)
        logits, _ = self._biased(self._table(state, first, banned), bias, usable)
        best, best_logit = first, logits[first]
        for token, logit in logits.items():  # candidates in rank order, then biased tokens
            if logit > best_logit:
                best, best_logit = token, logit
        return best

    def score(
        self,
        state: int,
        token_id: int,
        *,
        top: int,
        first: int | None = None,
        bias: Mapping[int, float] | None = None,
        banned: Collection[int] = (),
        allow_eos: bool = True,
    ) -> Scored:
        """Logprob of `token_id` at this context and the `top` most likely tokens.

        `first` is the oracle's draw that led the table (default: `token_id`, as for a
        dictated token). With `bias` (and the `banned` / `allow_eos` that `choose` saw), the
        table is the biased one `choose` picked `token_id` from."""
        lead = token_id if first is None else first
        table = self._table(state, lead, banned)
        if bias:
            logits, floor = self._biased(table, bias, self._usable(bias, banned, allow_eos))
        else:
            logits, floor = dict(table), table[-1][1] - _FLOOR_GAP
        norm = self._normalizer(logits, floor)
        logprob = logits.get(token_id, floor) - norm
        ranked: list[tuple[int, float]] = []
        if top > 0:
            order = sorted(logits.items(), key=lambda item: -item[1])
            ranked = [(token, value - norm) for token, value in order[:top]]
            if len(ranked) < top:
                ranked.extend(self._floor_tokens(state, logits, top - len(ranked), floor - norm))
        return Scored(token_id, logprob, tuple(ranked))

    def _floor_tokens(
        self, state: int, taken: Collection[int], count: int, logprob: float
    ) -> list[tuple[int, float]]:
        """`count` more tokens at the floor (past the candidates), drawn from the state."""
        out: list[tuple[int, float]] = []
        seen = set(taken)
        draw = mix64(state ^ _ALT_KEY ^ 0xFF)
        for attempt in range(4 * count + 64):
            if len(out) >= count or len(seen) >= self._count:
                break
            draw = mix64((draw + attempt) & MASK64)
            token = self._ordinary[draw % self._count]
            if token not in seen:
                seen.add(token)
                out.append((token, logprob))
        return out

    def prompt_scores(self, prompt: Sequence[int], start: int, top: int) -> list[Scored | None]:
        """Each prompt token's logprob given the tokens before it (greedy, unbiased), from
        position `start`; None for position 0 (nothing precedes it)."""
        out: list[Scored | None] = []
        state = INITIAL_STATE
        for position, token in enumerate(prompt):
            if position >= start:
                if position == 0:
                    out.append(None)
                else:
                    first = self.oracle.pick(state)
                    out.append(self.score(state, token, top=top, first=first))
            state = absorb(state, token)
        return out
