"""Plain ASCII text -> token ids, pre-token by pre-token from a cache (the prompt's hot path).

A byte-level BPE tokenizer splits text into pre-tokens (by its pre-tokenizer's regexes) and
runs BPE on each on its own: the ids of a text are the concatenation of its pre-tokens' ids.
Most of the tokenizers library's time on a short prompt goes to those regexes (a 48-word chat
prompt: ~70 us of encode, of which BPE is little; docs/benchmarks.md, "Tokenization"). Here
the same split is spelled in Python's `re` for the one input where that is exact without
Unicode tables (printable ASCII, tab, line breaks: letters, digits, punctuation and whitespace
are then plain character sets), and each pre-token's ids come from a cache; the ones not yet
seen go through the tokenizer, one batch per text.

Only pre-tokenizers spelled out here take this path (KNOWN, compared whole), on tokenizers that
add nothing around it: an identity normalizer, BPE without dropout, no truncation or padding.
Text with another character, or with a character an added token starting in ASCII starts with
(`<think>`, `<|EOT|>`: added tokens are split out before pre-tokenization), returns None: the
caller encodes it as before.

The split and the cache look-up of a text run in one C call where the extension is built
(_pretokens.c, for DeepSeek-V3's pre-tokenizer); `cached_ids` is their Python form, of the same
output (SWITCHYARD_NATIVE=0 or no C compiler: common/native.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import chain
from typing import Any, cast

from tokenizers import Tokenizer, models

from switchyard.common.native import load

# The C extension, unless not built or turned off (SWITCHYARD_NATIVE=0, common/native.py).
native: Any = load("switchyard.preprocessor._pretokens")

MAX_PIECES = 1 << 16  # pre-tokens kept; the cache starts over (from its warm set) when full
MAX_PIECE_CHARS = 64  # longer pre-tokens (runs of spaces, long words) are not kept

# Python's `re` for ASCII, for the classes the pre-tokenizers' regexes use: \p{L} letters,
# \p{N} digits, \p{P} and \p{S} punctuation and symbols (string.punctuation, 32 characters),
# \p{M} none; \s is Unicode White_Space (Python's \s would add \x1c-\x1f, excluded below).
_PUNCT = r"""!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~"""
_SPACE = r"\t\n\x0b\x0c\r "

# DeepSeek-V3 (and R1): digits in runs of up to 3, CJK runs (none in ASCII), then words.
_DEEPSEEK_V3 = {
    "type": "Sequence",
    "pretokenizers": [
        {
            "type": "Split",
            "pattern": {"Regex": "\\p{N}{1,3}"},
            "behavior": "Isolated",
            "invert": False,
        },
        {
            "type": "Split",
            "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
            "behavior": "Isolated",
            "invert": False,
        },
        {
            "type": "Split",
            "pattern": {
                "Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}"
                "\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
            },
            "behavior": "Isolated",
            "invert": False,
        },
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}
# Its three splits in one pass. Digits are split out first, 3 at a time from a run's left
# (the first alternative; no other one takes a digit, so no match crosses a run's edge), and
# the words regex then runs on the text between runs, whose ends are ends: `\s+(?!\S)`
# before a digit holds as it does at the end of the text.
_DEEPSEEK_V3_PIECES = re.compile(
    f"[0-9]{{1,3}}|[{_PUNCT}][A-Za-z]+|[^\\r\\n0-9A-Za-z{_PUNCT}]?[A-Za-z]+"
    f"| ?[{_PUNCT}]+[\\r\\n]*|[{_SPACE}]*[\\r\\n]+|[{_SPACE}]+(?![^{_SPACE}0-9])|[{_SPACE}]+"
).findall


def _deepseek_v3(text: str) -> list[str] | None:
    """The pre-tokens of ASCII text without control characters; None if some text would be
    left between them (it cannot be, for such text: kept as a check)."""
    pieces: list[str] = _DEEPSEEK_V3_PIECES(text)
    return pieces if sum(map(len, pieces)) == len(text) else None


# Every run of 1 to 3 digits: numbers would otherwise keep missing the cache until all were seen.
_DIGIT_GROUPS = [f"{n:0{width}d}" for width in (1, 2, 3) for n in range(10**width)]

# A text's ids (a list), the pre-tokens not in the cache yet (a tuple), or None (not plain).
Found = list[int] | tuple[str, ...] | None
# The C form of `cached_ids` for a split: (plain characters, cache, text) -> Found
Native = Callable[[bytes, dict[str, list[int]], str], Found]


@dataclass(frozen=True)
class Known:
    """A pre-tokenizer spelled here: its config, its split in Python, the pre-tokens cached up
    front, and its split and look-up in C (None where not built)."""

    config: dict[str, Any]
    split: Callable[[str], list[str] | None]
    warm: list[str]
    native: Native | None


KNOWN: list[Known] = [
    Known(_DEEPSEEK_V3, _deepseek_v3, _DIGIT_GROUPS, native and native.deepseek_v3),
]


def cached_ids(
    split: Callable[[str], list[str] | None],
    plain: Callable[[str], object],
    cache: dict[str, list[int]],
    text: str,
) -> Found:
    """The Python form of the C look-up: the ids of `text` if every pre-token is cached, else
    the pre-tokens not cached (in order of first use, each once); None when not plain."""
    if plain(text) is None:
        return None
    pieces = split(text)
    if pieces is None:
        return None
    try:
        return list(chain.from_iterable(map(cache.__getitem__, pieces)))
    except KeyError:  # pre-tokens not seen yet
        return tuple(dict.fromkeys(p for p in pieces if p not in cache))


def _known(tokenizer: Tokenizer) -> Known | None:
    if tokenizer.pre_tokenizer is None or tokenizer.truncation or tokenizer.padding:
        return None
    model = tokenizer.model
    if not isinstance(model, models.BPE) or model.dropout:
        return None
    normalizer = tokenizer.normalizer
    if normalizer is not None:
        state = json.loads(normalizer.__getstate__())
        if state.get("type") != "Sequence" or state.get("normalizers"):
            return None
    pre = json.loads(tokenizer.pre_tokenizer.__getstate__())
    return next((known for known in KNOWN if pre == known.config), None)


class PreTokenCache:
    """Ids of plain ASCII texts from cached pre-tokens, for a tokenizer `of` accepts."""

    def __init__(self, tokenizer: Tokenizer, known: Known, use_native: bool = True) -> None:
        self._tokenizer = tokenizer
        warm = known.warm
        encoded = tokenizer.encode_batch_fast(warm, add_special_tokens=False) if warm else []
        self._warm = {p: e.ids for p, e in zip(warm, encoded, strict=True)}
        self._ids: dict[str, list[int]] = dict(self._warm)
        # The characters no added token's text holds and none could start (printable ASCII,
        # tab, line breaks): the text is then one run of pre-tokens.
        starts = {t.content[0] for t in tokenizer.get_added_tokens_decoder().values() if t.content}
        allowed = {chr(c) for c in [9, 10, 11, 12, 13, *range(32, 127)]} - starts
        self._lookup: Callable[[str], Found]
        if use_native and known.native is not None:
            table = bytes(chr(c) in allowed for c in range(128))
            self._lookup = partial(known.native, table, self._ids)
        else:
            plain = re.compile(f"[{''.join(map(re.escape, sorted(allowed)))}]*").fullmatch
            self._lookup = partial(cached_ids, known.split, plain, self._ids)

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> PreTokenCache | None:
        """The cache for this tokenizer, None if its pre-tokenizer is not one spelled here."""
        known = _known(tokenizer)
        return cls(tokenizer, known) if known is not None else None

    def encode(self, text: str) -> list[int] | None:
        """The ids of `text` (no special tokens added), None when it is not plain ASCII."""
        cache = self._ids
        if len(cache) > MAX_PIECES:
            cache.clear()
            cache.update(self._warm)
        found = self._lookup(text)
        if not isinstance(found, tuple):
            return found
        missing = list(found)
        encoded = self._tokenizer.encode_batch_fast(missing, add_special_tokens=False)
        for piece, enc in zip(missing, encoded, strict=True):
            cache[piece] = enc.ids
        out = cast(list[int], self._lookup(text))  # every pre-token is cached now
        for piece in missing:
            if len(piece) > MAX_PIECE_CHARS:
                del cache[piece]
        return out
