"""Token id -> its text and UTF-8 bytes, as OpenAI's logprobs show them (cached per tokenizer).

A byte-level token may hold part of a character: its `bytes` are exact (read from the
vocabulary through GPT-2's byte<->character map) and its text decodes them with U+FFFD for
what is incomplete, as OpenAI's API does.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders


def byte_decoder() -> dict[str, int]:
    """GPT-2's printable character -> byte map (the inverse of bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenTexts:
    __slots__ = ("_tokenizer", "_byte_level", "_added", "_cache")

    _BYTES = byte_decoder()

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)
        self._added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self._lookup(token_id)
        return found

    def _lookup(self, token_id: int) -> tuple[str, list[int]]:
        added = self._added.get(token_id)
        if added is not None:
            return added, list(added.encode("utf-8"))
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return "", []
        if self._byte_level:
            table = self._BYTES
            raw = bytes(table.get(c, 0) for c in piece)
            return raw.decode("utf-8", errors="replace"), list(raw)
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return text, list(text.encode("utf-8"))
