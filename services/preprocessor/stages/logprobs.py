"""Engine logprobs -> OpenAI's logprobs objects (chat `content` entries, completions lists).

The engines order a token's alternatives differently (SGLang: most likely first; vLLM: the
chosen token first, then the most likely): both are read as (id, logprob) pairs, de-duplicated
and sorted, and the `top` most likely kept, as OpenAI's `top_logprobs` are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from switchyard.preprocessor.token_texts import TokenTexts
from switchyard.protos.messages import PromptLogprobs, TokenLogprobs


def _top(ids: Sequence[int], lps: Sequence[float], top: int) -> list[tuple[int, float]]:
    if top <= 0 or not ids:
        return []
    best: dict[int, float] = {}
    for token_id, lp in zip(ids, lps, strict=False):
        if token_id not in best or lp > best[token_id]:
            best[token_id] = lp
    return sorted(best.items(), key=lambda pair: -pair[1])[:top]


def chat_entries(
    texts: TokenTexts, token_ids: Sequence[int], logprobs: TokenLogprobs, top: int
) -> list[dict[str, Any]]:
    """`choices[i].logprobs.content` entries for these tokens."""
    out = []
    has_top = bool(logprobs.top_ids)
    for i, token_id in enumerate(token_ids):
        text, raw = texts.get(token_id)
        alternatives = []
        if has_top and i < len(logprobs.top_ids):
            for alt_id, alt_lp in _top(logprobs.top_ids[i], logprobs.top_logprobs[i], top):
                alt_text, alt_raw = texts.get(alt_id)
                alternatives.append({"token": alt_text, "logprob": alt_lp, "bytes": alt_raw})
        lp = logprobs.logprobs[i] if i < len(logprobs.logprobs) else 0.0
        out.append({"token": text, "logprob": lp, "bytes": raw, "top_logprobs": alternatives})
    return out


class CompletionLogprobs:
    """The `logprobs` object of one completions choice, built token by token; `text_offset`
    counts characters of the choice's text (the echoed prompt included)."""

    __slots__ = ("_texts", "_top", "tokens", "token_logprobs", "top_logprobs", "text_offset", "_at")

    def __init__(self, texts: TokenTexts, top: int) -> None:
        self._texts = texts
        self._top = top
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []
        self._at = 0

    def add(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float | None],
        top_ids: Sequence[Sequence[int]],
        top_lps: Sequence[Sequence[float]],
    ) -> dict[str, list[Any]]:
        """Record these tokens; returns just their part (what a streamed chunk carries)."""
        start = len(self.tokens)
        for i, token_id in enumerate(token_ids):
            text, _ = self._texts.get(token_id)
            self.tokens.append(text)
            self.token_logprobs.append(logprobs[i] if i < len(logprobs) else None)
            if i < len(top_ids) and top_ids[i]:
                pairs = _top(top_ids[i], top_lps[i], self._top)
                self.top_logprobs.append({self._texts.get(t)[0]: lp for t, lp in pairs})
            else:
                self.top_logprobs.append(None)
            self.text_offset.append(self._at)
            self._at += len(text)
        return {
            "tokens": self.tokens[start:],
            "token_logprobs": self.token_logprobs[start:],
            "top_logprobs": self.top_logprobs[start:],
            "text_offset": self.text_offset[start:],
        }

    def add_output(self, token_ids: Sequence[int], logprobs: TokenLogprobs) -> dict[str, list[Any]]:
        return self.add(token_ids, logprobs.logprobs, logprobs.top_ids, logprobs.top_logprobs)

    def add_prompt(self, token_ids: Sequence[int], prompt: PromptLogprobs) -> dict[str, list[Any]]:
        return self.add(token_ids, prompt.logprobs, prompt.top_ids, prompt.top_logprobs)

    def whole(self) -> dict[str, list[Any]]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }

    def total(self) -> float:
        return sum(lp for lp in self.token_logprobs if lp is not None)
