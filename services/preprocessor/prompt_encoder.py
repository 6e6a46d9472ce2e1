"""Prompt text -> token ids for the `tokenize` stage: cached segments, cheap rejections.

**Segments.** A rendered chat prompt is a run of special tokens (`<｜User｜>`, ...) and the
texts between them. A Hugging Face tokenizer splits on added tokens before anything else and
tokenizes the pieces independently, so the ids of a prompt are exactly the concatenation of
its pieces' ids. Pieces are looked up in a bounded LRU (by characters held): a multi-turn
conversation, or a system prompt shared by many users, is tokenized once, and each new turn
costs only its new text. Only special tokens that the tokenizer matches literally (not
normalized, no lstrip/rstrip/single_word, not part of a longer added token) split pieces.

**Rejections first.** A prompt that cannot fit is rejected before it is tokenized in full:
no token is longer than `max_token_bytes`, so `utf8_bytes / max_token_bytes` tokens is a
lower bound that costs no tokenization (a 31 MB prompt is refused in microseconds); a long
prompt that passes it is tokenized in growing prefixes (cut at a space) and refused as soon
as a prefix alone holds more tokens than the budget.

**Pre-tokens.** Short plain ASCII pieces are tokenized from cached pre-tokens where the
tokenizer's pre-tokenizer is one pretokens.py spells (the same ids for a quarter of the CPU);
long texts are tokenized on a worker thread through `encode_batch_fast`, which releases the
GIL.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable
from typing import Any

from tokenizers import Tokenizer, decoders

from .pretokens import PreTokenCache

CACHE_CHARS = 32 * 1024 * 1024  # characters of segment text kept with their ids
MIN_CACHED_CHARS = 16  # shorter pieces are cheaper to tokenize than to keep
# A prefix cut at a space can tokenize differently near the cut than the whole text does:
# this many tokens of slack keep a refusal certain.
CUT_SLACK = 16


class PromptTooLong(Exception):
    """The prompt certainly has more than the allowed tokens: at least `tokens`."""

    def __init__(self, tokens: int) -> None:
        super().__init__(f"at least {tokens} tokens")
        self.tokens = tokens


def max_token_bytes(tokenizer: Tokenizer) -> int:
    """The UTF-8 length of the longest token (special tokens included)."""
    if isinstance(tokenizer.decoder, decoders.ByteLevel):
        # Byte-level vocabularies spell one byte per character: no decoding needed.
        added = tokenizer.get_added_tokens_decoder().values()
        longest_added = max((len(t.content.encode("utf-8")) for t in added), default=1)
        return max(longest_added, max(map(len, tokenizer.get_vocab(with_added_tokens=False))))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    texts = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    return max((len(t.encode("utf-8", "surrogatepass")) for t in texts), default=1) or 1


def _identity_normalizer(tokenizer: Tokenizer) -> bool:
    normalizer = tokenizer.normalizer
    if normalizer is None:
        return True
    state = json.loads(normalizer.__getstate__())
    return state.get("type") == "Sequence" and not state.get("normalizers")


def splitting_tokens(tokenizer: Tokenizer, wanted: Iterable[str]) -> list[str]:
    """The added tokens of `wanted` that are safe piece boundaries for this tokenizer: matched
    literally (a "normalized" token only when the normalizer changes nothing), stripping
    nothing around them, and not part of a longer added token."""
    added: dict[str, Any] = {t.content: t for t in tokenizer.get_added_tokens_decoder().values()}
    identity = _identity_normalizer(tokenizer)
    safe = []
    for text in dict.fromkeys(wanted):
        token = added.get(text)
        if token is None or not text:
            continue
        if (token.normalized and not identity) or token.lstrip or token.rstrip:
            continue
        if token.single_word:
            continue
        if any(text in other and other != text for other in added):
            continue
        safe.append(text)
    return safe


class PromptEncoder:
    def __init__(
        self,
        tokenizer: Tokenizer,
        split_tokens: Iterable[str],
        max_token_bytes: int,
        cache_chars: int = CACHE_CHARS,
    ) -> None:
        self._tokenizer = tokenizer
        self.max_token_bytes = max(1, max_token_bytes)
        self._cache_chars = cache_chars
        self._cache: dict[str, list[int]] = {}
        self._cached_chars = 0
        tokens = sorted(set(split_tokens), key=len, reverse=True)
        self._special: dict[str, int] = {}
        for text in tokens:
            token_id = tokenizer.token_to_id(text)
            if token_id is not None:
                self._special[text] = token_id
        tokens = list(self._special)
        self._split = (
            re.compile("(" + "|".join(re.escape(t) for t in tokens) + ")").split if tokens else None
        )
        self.pretokens = PreTokenCache.of(tokenizer)  # None: every piece through encode
        self.hits = 0  # pieces found in the cache (tests and benchmarks read these)
        self.misses = 0

    async def encode(self, text: str, limit: int, offload_chars: int) -> list[int]:
        """The ids of `text` (no special tokens added). Raises PromptTooLong when it certainly
        has more than `limit` tokens. From `offload_chars` characters of new text on, the
        tokenization runs on a worker thread."""
        self.check_bytes(text, limit)
        pieces = self._split(text) if self._split is not None else [text]
        cache = self._cache
        special = self._special
        known: list[list[int] | None] = []
        missing: list[int] = []
        missing_chars = 0
        known_tokens = 0
        for i, piece in enumerate(pieces):
            if i & 1:  # a splitting token (re.split puts them at odd indices)
                known.append([special[piece]])
                known_tokens += 1
                continue
            if not piece:
                known.append(None)
                continue
            ids = cache.get(piece)
            if ids is not None:
                cache[piece] = cache.pop(piece)  # most recently used last
                self.hits += 1
                known.append(ids)
                known_tokens += len(ids)
            else:
                known.append(None)
                missing.append(i)
                missing_chars += len(piece)
        if known_tokens > limit:
            raise PromptTooLong(known_tokens)
        if missing:
            self.misses += len(missing)
            texts = [pieces[i] for i in missing]
            budget = limit - known_tokens
            try:
                if missing_chars >= offload_chars:
                    encoded = await asyncio.to_thread(self._encode_checked, texts, budget)
                else:  # (the pre-token cache is the event loop's alone)
                    encoded = self._encode_checked(texts, budget, self.pretokens)
            except PromptTooLong as exc:
                raise PromptTooLong(known_tokens + exc.tokens) from None
            for i, ids in zip(missing, encoded, strict=True):
                known[i] = ids
                self._remember(pieces[i], ids)
        out: list[int] = []
        for ids in known:
            if ids:
                out += ids
        return out

    def check_bytes(self, text: str, limit: int) -> None:
        """PromptTooLong when `text` certainly has more than `limit` tokens, by its bytes."""
        # len(text) <= UTF-8 bytes <= 4 * len(text): count the bytes only when it can matter.
        per_token = self.max_token_bytes
        if len(text) * 4 // per_token <= limit:
            return
        at_least = len(text.encode("utf-8", "surrogatepass")) // per_token
        if at_least > limit:
            raise PromptTooLong(at_least)

    def _encode_checked(
        self, texts: list[str], budget: int, pretokens: PreTokenCache | None = None
    ) -> list[list[int]]:
        """The texts' ids from `pretokens` where it takes them, the others through
        encode_batch_fast; after refusing a text whose prefix alone is over the budget (the
        PromptTooLong counts this text's tokens only). The fast variant computes no character
        offsets, which nothing here reads: the same ids for less CPU (docs/benchmarks.md,
        "Tokenization"); it releases the GIL as encode_batch does."""
        for text in texts:
            self._check_prefixes(text, budget)
        if pretokens is None:
            encoded = self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)
            return [e.ids for e in encoded]
        out = [pretokens.encode(text) for text in texts]
        rest = [text for text, ids in zip(texts, out, strict=True) if ids is None]
        if rest:
            more = iter(self._tokenizer.encode_batch_fast(rest, add_special_tokens=False))
            out = [next(more).ids if ids is None else ids for ids in out]
        return out  # type: ignore[return-value]

    def _check_prefixes(self, text: str, budget: int) -> None:
        # Prefixes of 2x, 4x, ... the budget in characters; each costs what it tokenizes, so
        # the total stays within twice the last prefix.
        cut = 2 * (budget + CUT_SLACK)
        while cut < len(text) // 2:
            at = text.rfind(" ", cut - 256, cut)
            prefix = text[: at if at > 0 else cut]
            encoded = self._tokenizer.encode_batch_fast([prefix], add_special_tokens=False)
            count = len(encoded[0].ids)
            if count - CUT_SLACK > budget:
                raise PromptTooLong(count - CUT_SLACK)
            cut *= 2

    def _remember(self, piece: str, ids: list[int]) -> None:
        size = len(piece)
        if size < MIN_CACHED_CHARS or size > self._cache_chars:
            return
        self._cache[piece] = ids
        self._cached_chars += size
        while self._cached_chars > self._cache_chars:
            oldest = next(iter(self._cache))
            self._cached_chars -= len(oldest)
            del self._cache[oldest]

    def cached_chars(self) -> int:
        return self._cached_chars
