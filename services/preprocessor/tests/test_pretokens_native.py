"""_pretokens.c against its Python form (pretokens.cached_ids) and the tokenizer's encode."""

from __future__ import annotations

import random
import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from switchyard.preprocessor import pretokens
from switchyard.preprocessor.pretokens import MAX_PIECE_CHARS, Found, PreTokenCache, cached_ids
from switchyard.preprocessor.tokenizer import default_tokenizer_dir

native = pretokens.native
pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built")

TOKENIZER = Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
KNOWN = pretokens._known(TOKENIZER)
assert KNOWN is not None
# As PreTokenCache builds them: '<' starts added tokens (<think>, <|EOT|>), so it is not plain.
ALLOWED = {chr(c) for c in [9, 10, 11, 12, 13, *range(32, 127)]} - {"<"}
TABLE = bytes(chr(c) in ALLOWED for c in range(128))
PLAIN = re.compile(f"[{''.join(map(re.escape, sorted(ALLOWED)))}]*").fullmatch
# Every ASCII class the split tells apart, and runs of each.
RUNS = [
    "a", "Zq", "hello", "x" * (MAX_PIECE_CHARS + 7), "7", "42", "123", "1234567",
    "!", "...", "'s", "-->", "\\", " ", "   ", " " * (MAX_PIECE_CHARS + 3), "\t", "\t\t",
    "\x0b", "\x0c", "\n", "\r\n", "\n\n\n", " \n ", "\r", "<", "<think>", "\x00", "\x1c",
    "\x7f", "é", "你好",
]  # fmt: skip


def both(cache: dict[str, list[int]], text: str) -> Found:
    """The C look-up's answer, checked against the Python form's on the same cache."""
    assert native is not None
    c_form = native.deepseek_v3(TABLE, cache, text)
    assert c_form == cached_ids(KNOWN.split, PLAIN, cache, text), repr(text)
    return c_form


def check(text: str) -> None:
    """Both forms agree with an empty cache, a warm one, and once every pre-token is in it; the
    ids then are the tokenizer's own."""
    cache: dict[str, list[int]] = {}
    missing = both(cache, text)
    if missing is None:
        return
    assert isinstance(missing, tuple) or missing == [] == list(text)
    both({p: [1] for p in missing[::2]}, text)  # some cached
    for piece in missing:
        cache[piece] = TOKENIZER.encode(piece, add_special_tokens=False).ids
    ids = both(cache, text)
    assert ids == TOKENIZER.encode(text, add_special_tokens=False).ids, repr(text)


class TestParity:
    @settings(max_examples=1500, deadline=None)
    @given(st.lists(st.sampled_from(RUNS), max_size=30))
    def test_runs_of_every_class(self, parts: list[str]) -> None:
        check("".join(parts))

    @settings(max_examples=1500, deadline=None)
    @given(st.text(alphabet=string.printable + "<\x00\x7f", max_size=120))
    def test_ascii_text(self, text: str) -> None:
        check(text)

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=40))
    def test_any_text(self, text: str) -> None:
        check(text)

    def test_generated_prose(self) -> None:
        rng = random.Random(34)
        for _ in range(500):
            check("".join(rng.choice(RUNS[:-5]) for _ in range(rng.randint(0, 200))))

    def test_every_text_of_up_to_4_characters_of_each_class(self) -> None:
        alphabet = "a1 \n.\t\r\x0b"
        texts = [""]
        for _ in range(4):
            texts = [t + c for t in texts for c in alphabet]
            for text in texts:
                check(text)

    def test_long_text(self) -> None:
        """More pre-tokens than the C call keeps on its stack."""
        text = " ".join(["the engine's 2026-12-07 answer,\n"] * 400)
        check(text)


class TestTheCacheUsesIt:
    def test_same_ids_both_forms(self) -> None:
        c_cache, py_cache = PreTokenCache(TOKENIZER, KNOWN), PreTokenCache(TOKENIZER, KNOWN, False)
        for text in ["", "Hello, world!", "a" * 200 + " b", "x<think>", "naïve", "12 34\n\n"]:
            assert c_cache.encode(text) == py_cache.encode(text)
        assert "a" * 200 not in c_cache._ids and " b" in c_cache._ids

    def test_bad_arguments(self) -> None:
        assert native is not None
        with pytest.raises(TypeError):
            native.deepseek_v3(b"short", {}, "text")
        with pytest.raises(TypeError):
            native.deepseek_v3(TABLE, {"text": (1, 2)}, "text")
