"""Incremental detokenization: token id deltas in, new text out, per request.

The prefix/read offset technique of vLLM and TGI: keep a short window of ids; `prefix` is
the text of the already-emitted ids at its start, and each call decodes the window and
emits what follows `prefix`, unless the text ends in U+FFFD (a character whose bytes are
split over tokens that have not all arrived yet), in which case the ids are held back.
Only the window is decoded, so a call costs O(window), not O(output).

Any token boundary may start the window: for byte-level tokenizers UTF-8 resynchronises,
and decoders that drop a leading space (SentencePiece) drop it from the prefix text too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT = "\ufffd"
# Tokens of emitted text kept as context in front of new ids.
CONTEXT_TOKENS = 4
# A character spans at most 4 bytes: more pending ids than this that still end in U+FFFD
# are really invalid bytes, emitted as they are; pending ids that add no text (skipped
# special tokens) are let go too.
MAX_PENDING_TOKENS = 16


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    __slots__ = ("_decode_fn", "_skip", "_ids", "_read", "_prefix")

    def __init__(
        self,
        tokenizer: Decoder,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        """`prompt_ids`: the prompt (only its last few ids are kept) as decoding context."""
        self._decode_fn = tokenizer.decode
        self._skip = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:])
        self._prefix = self._decode(self._ids) if self._ids else ""
        if self._prefix.endswith(REPLACEMENT):
            # The prompt ends inside a character: no safe context, start clean.
            self._ids = []
            self._prefix = ""
        self._read = len(self._ids)

    def add(self, token_ids: Sequence[int]) -> str:
        """The text that `token_ids` complete; "" while a character is still incomplete."""
        if not token_ids:
            return ""
        ids = self._ids
        ids.extend(token_ids)
        text = self._decode(ids)
        prefix_len = len(self._prefix)
        too_many = len(ids) - self._read > MAX_PENDING_TOKENS
        if text[-1:] == REPLACEMENT:
            return self._release(text, prefix_len) if too_many else ""
        if len(text) <= prefix_len and not too_many:
            return ""
        if len(ids) > CONTEXT_TOKENS:
            del ids[:-CONTEXT_TOKENS]
            self._prefix = self._decode(ids)
        else:
            self._prefix = text
        self._read = len(ids)
        return text[prefix_len:]

    def flush(self) -> str:
        """Whatever is held back (an incomplete character decodes as U+FFFD)."""
        if len(self._ids) == self._read:
            return ""
        return self._release(self._decode(self._ids), len(self._prefix))

    def _release(self, text: str, prefix_len: int) -> str:
        # The text may end inside a character, so it cannot serve as a prefix: restart empty.
        self._ids = []
        self._prefix = ""
        self._read = 0
        return text[prefix_len:]

    def _decode(self, ids: list[int]) -> str:
        return self._decode_fn(ids, skip_special_tokens=self._skip)
