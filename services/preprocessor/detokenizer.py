"""Incremental detokenization: token id deltas in, new text out, per request (hot path).

For byte-level BPE tokenizers (GPT-2's scheme: DeepSeek, Llama 3, Qwen) decoding is the
concatenation of the tokens' bytes: a `ByteTable` holds each token's bytes (built and checked
against the tokenizer's own decode once per tokenizer) and a stream is Python's incremental
UTF-8 decoder over them, which holds back an incomplete last character by itself (a third of
DecodeStream's cost per token: docs/benchmarks.md, "Detokenization"). Other tokenizers use
the tokenizers library's `DecodeStream` (the prefix/read-offset technique of vLLM and TGI,
done in Rust: cheaper per token than decoding a window from Python). Either way, text
whose last character is still incomplete (its UTF-8 bytes split over tokens that have not
all arrived) is held back until it completes; `flush` releases whatever is held at the end
of a stream, an incomplete character decoding as U+FFFD.

With DecodeStream, the prompt's last few ids seed the stream as context only (decoders that
drop a leading space, such as SentencePiece's, then keep it on the first output token); a
prompt that ends inside a character gives no safe context and is not used. Byte-level
decoding needs no context.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer, decoders
from tokenizers.decoders import DecodeStream

from .token_texts import byte_decoder

log = logging.getLogger(__name__)

REPLACEMENT = "\ufffd"
# Tokens of the prompt kept as decoding context in front of the first output ids.
CONTEXT_TOKENS = 4
# Ids of the vocabulary whose table bytes are checked against the tokenizer's decode.
CHECKED_IDS = 4096
# codecs' incremental UTF-8 decoder, inline (its `decode` is a Python frame per token).
_utf8_decode = codecs.utf_8_decode


class ByteTable:
    """Each token id's bytes as the tokenizer decodes it: `keep` with special tokens, `skip`
    without (an id the vocabulary lacks decodes to nothing)."""

    __slots__ = ("keep", "skip")

    def __init__(self, keep: list[bytes], skip: list[bytes]) -> None:
        self.keep = keep
        self.skip = skip

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> ByteTable | None:
        """The table of a byte-level tokenizer, or None (another decoder, or a table that
        does not decode as the tokenizer does: DecodeStream then serves)."""
        if not isinstance(tokenizer.decoder, decoders.ByteLevel):
            return None
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        keep = [b""] * size
        added = tokenizer.get_added_tokens_decoder()  # decoded as their text
        latin1 = str.maketrans({c: chr(b) for c, b in byte_decoder().items()})
        try:
            for piece, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
                if 0 <= token_id < size and token_id not in added:
                    keep[token_id] = piece.translate(latin1).encode("latin-1")
        except UnicodeEncodeError:  # a piece outside the byte alphabet: not plain byte-level
            return None
        skip = list(keep)
        for token_id, token in added.items():
            if 0 <= token_id < size:
                keep[token_id] = token.content.encode("utf-8")
                skip[token_id] = b"" if token.special else keep[token_id]
        table = cls(keep, skip)
        if not table._decodes_as(tokenizer):
            log.info("the byte table disagrees with the tokenizer's decode: DecodeStream serves")
            return None
        return table

    def _decodes_as(self, tokenizer: Tokenizer) -> bool:
        """Every added token, and runs of 8 ids spread over the vocabulary, decode alike."""
        size = len(self.keep)
        step = max(1, size // CHECKED_IDS)
        spread = list(range(0, size, step))
        groups = [spread[i : i + 8] for i in range(0, len(spread), 8)]
        groups += [[i] for i in tokenizer.get_added_tokens_decoder() if 0 <= i < size]
        for skip, table in ((False, self.keep), (True, self.skip)):
            want = tokenizer.decode_batch(groups, skip_special_tokens=skip)
            for ids, text in zip(groups, want, strict=True):
                if b"".join([table[i] for i in ids]).decode("utf-8", "replace") != text:
                    return False
        return True


class IncrementalDetokenizer:
    __slots__ = ("_tokenizer", "_stream", "_skip", "_pending", "_bytes", "_held")

    def __init__(
        self,
        tokenizer: Tokenizer | Any,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        """`tokenizer`: a tokenizers.Tokenizer, or a bundle holding one as `.tokenizer` (and
        its ByteTable as `.byte_table`, None when it has none)."""
        tok: Tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        self._tokenizer = tok
        self._skip = skip_special_tokens
        self._pending: list[int] = []  # ids fed since the last text came out (DecodeStream)
        table: ByteTable | None = getattr(tokenizer, "byte_table", None)
        if table is not None:
            # Byte-level: no context needed (no decoder strips or adds anything at the start).
            self._bytes: list[bytes] | None = table.skip if skip_special_tokens else table.keep
            self._held = b""  # the bytes of a character not complete yet
            return
        self._bytes = None
        context = list(prompt_ids[-CONTEXT_TOKENS:])
        if context and tok.decode(context, skip_special_tokens=skip_special_tokens).endswith(
            REPLACEMENT
        ):
            context = []
        self._stream = DecodeStream(ids=context or None, skip_special_tokens=skip_special_tokens)

    def add(self, token_ids: Sequence[int]) -> str:
        """The text that `token_ids` complete; "" while a character is still incomplete."""
        if not token_ids:
            return ""
        table = self._bytes
        if table is not None:
            try:
                data = (
                    table[token_ids[0]]
                    if len(token_ids) == 1
                    else b"".join([table[i] for i in token_ids])
                )
            except IndexError:  # an id past the vocabulary decodes to nothing
                size = len(table)
                data = b"".join([table[i] for i in token_ids if 0 <= i < size])
            held = self._held
            if held:
                data = held + data
            decoded, used = _utf8_decode(data, "replace", False)
            if used < len(data):
                self._held = data[used:]
            elif held:
                self._held = b""
            return decoded
        text = self._stream.step(self._tokenizer, token_ids)
        if text is None:
            self._pending.extend(token_ids)
            return ""
        if self._pending:
            self._pending.clear()
        return text

    def flush(self) -> str:
        """Whatever is held back (an incomplete character decodes as U+FFFD)."""
        if self._bytes is not None:
            held, self._held = self._held, b""
            return _utf8_decode(held, "replace", True)[0] if held else ""
        if not self._pending:
            return ""
        pending, self._pending = self._pending, []
        self._stream = DecodeStream(skip_special_tokens=self._skip)
        return self._tokenizer.decode(pending, skip_special_tokens=self._skip)
