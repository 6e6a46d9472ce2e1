"""PreTokenCache: the same ids as the tokenizer's own encode, or None (the caller encodes)."""

from __future__ import annotations

import itertools
import random
import string

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, pre_tokenizers

from switchyard.preprocessor.pretokens import PreTokenCache
from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir

# Pieces that meet every alternative of the words regex and its edges: digit runs of every
# length, punctuation before letters, a space before punctuation, line breaks after it, runs of
# whitespace before a word, a digit or the end.
PIECES = [
    *string.ascii_letters,
    *string.digits,
    *string.punctuation,
    *" \t\n\r\x0b\x0c",
    "hello",
    " world",
    "  ",
    "\n\n",
    "\r\n",
    " \n ",
    "12345",
    "1234567",
    "x2",
    "'s",
    " 'll",
    ".\n",
    "...",
    "--flag",
    "a_b",
    "\t\tdef",
    "<",
    "think>",
]
ALPHABET = string.printable + "<"


def _tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))


TOKENIZER = _tokenizer()
CACHE = PreTokenCache.of(TOKENIZER)


def full(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False).ids


def check(text: str) -> None:
    assert CACHE is not None
    ids = CACHE.encode(text)
    if ids is None:  # only text the cache cannot take: another character, or an added token's
        assert (
            not text.isascii()
            or "<" in text
            or any(c in text for c in map(chr, [*range(0, 9), *range(14, 32), 127]))
        )
    else:
        assert ids == full(text), repr(text)
        assert CACHE.encode(text) == ids  # and again, from the cache


class TestSameIds:
    @settings(max_examples=1500, deadline=None)
    @given(st.lists(st.sampled_from(PIECES), max_size=40))
    def test_pieces(self, parts: list[str]) -> None:
        check("".join(parts))

    @settings(max_examples=1500, deadline=None)
    @given(st.text(alphabet=ALPHABET, max_size=80))
    def test_printable_text(self, text: str) -> None:
        check(text)

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=40))
    def test_any_text(self, text: str) -> None:
        check(text)

    def test_every_pair_of_characters(self) -> None:
        chars = string.printable
        for a in chars:
            for b in chars:
                check(a + b)
                check(f"x{a}{b}1")

    def test_every_short_text_of_a_small_alphabet(self) -> None:
        """Digit runs next to whitespace runs (a run's edge is an end for `\\s+(?!\\S)`),
        letters, punctuation, line breaks: every text of up to 4 of them."""
        for size in range(1, 5):
            for chars in itertools.product("a1 \n.\t\r", repeat=size):
                check("".join(chars))

    def test_prose(self) -> None:
        rng = random.Random(7)
        words = ["the", "The", "engine's", "42", "2026-12-07", "(ok)", "x=1;", "\n\n", "  "]
        for _ in range(200):
            check(" ".join(rng.choice(words) for _ in range(rng.randint(1, 60))))


class TestWhenItDoesNotApply:
    def test_added_tokens_and_other_characters(self) -> None:
        assert CACHE is not None
        for text in ["x<think>y", "<|EOT|>", "naïve", "你好", "a\x00b", "a\x1cb"]:
            assert CACHE.encode(text) is None

    def test_another_pre_tokenizer(self) -> None:
        other = _tokenizer()
        other.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        assert PreTokenCache.of(other) is None

    def test_truncation(self) -> None:
        other = _tokenizer()
        other.enable_truncation(8)
        assert PreTokenCache.of(other) is None

    def test_the_bundles_encoder_uses_it(self, bundle: TokenizerBundle) -> None:
        assert bundle.prompts.pretokens is not None


class TestCacheBounds:
    def test_starts_over_when_full(self, monkeypatch) -> None:
        import switchyard.preprocessor.pretokens as module

        cache = PreTokenCache.of(TOKENIZER)
        assert cache is not None
        warm = len(cache._ids)  # every run of 1 to 3 digits
        assert warm == 1110 and cache._ids["007"] == full("007")
        monkeypatch.setattr(module, "MAX_PIECES", warm + 10)
        text = " ".join(f"w{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(30))
        assert cache.encode(text) == full(text)
        assert cache.encode("fresh words here 123") == full("fresh words here 123")
        assert len(cache._ids) == warm + 4  # "fresh", " words", " here", " "

    def test_long_pieces_not_kept(self) -> None:
        cache = PreTokenCache.of(TOKENIZER)
        assert cache is not None
        text = "a" * 200 + " b"
        assert cache.encode(text) == full(text)
        assert "a" * 200 not in cache._ids and " b" in cache._ids
