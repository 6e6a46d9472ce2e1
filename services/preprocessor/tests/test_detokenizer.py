from __future__ import annotations

import random

import pytest

from switchyard.preprocessor.detokenizer import ByteTable, IncrementalDetokenizer
from switchyard.preprocessor.tokenizer import TokenizerBundle

TEXTS = [
    "你好，世界！今天天气很好。",
    "Emoji: 😀👍🏽🇫🇷 family 👨‍👩‍👧‍👦 done.",
    "Mixed: naïve café — 日本語のテキスト and Ελληνικά, 🤖 says “hi”.",
    "def f(x):\n    return x ** 2  # 平方\n",
]


class WithoutByteTable:
    """The bundle, as a tokenizer without a ByteTable would be: DecodeStream serves it."""

    byte_table = None

    def __init__(self, bundle: TokenizerBundle) -> None:
        self._bundle = bundle

    def __getattr__(self, name: str) -> object:
        return getattr(self._bundle, name)


@pytest.fixture(params=["byte-table", "decode-stream"])
def bundle(request: pytest.FixtureRequest, bundle: TokenizerBundle) -> TokenizerBundle:
    """Every test runs on both detokenizer paths; they must give the same text."""
    if request.param == "byte-table":
        assert bundle.byte_table is not None  # the DeepSeek tokenizer is byte-level
        return bundle
    return WithoutByteTable(bundle)  # type: ignore[return-value]


class TestByteTable:
    def test_other_decoders_get_none(self) -> None:
        from tokenizers import Tokenizer, decoders, models

        tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
        tok.decoder = decoders.WordPiece()
        assert ByteTable.of(tok) is None

    def test_a_table_that_decodes_otherwise_is_refused(self, bundle: TokenizerBundle) -> None:
        table = ByteTable.of(bundle.tokenizer)
        assert table is not None
        table.keep[0] += b"!"  # as if the table were built wrong (id 0 is always checked)
        assert not table._decodes_as(bundle.tokenizer)


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map: one single-byte token per byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def stream(detok: IncrementalDetokenizer, ids: list[int], sizes: list[int]) -> list[str]:
    pieces, i = [], 0
    for size in sizes:
        pieces.append(detok.add(ids[i : i + size]))
        i += size
    pieces.append(detok.flush())
    return pieces


class TestMultiByte:
    @pytest.mark.parametrize("text", TEXTS)
    def test_one_token_at_a_time(self, bundle: TokenizerBundle, text: str) -> None:
        ids = bundle.encode(text)
        detok = IncrementalDetokenizer(bundle)
        pieces = stream(detok, ids, [1] * len(ids))
        assert "".join(pieces) == bundle.decode(ids) == text
        assert not any("\ufffd" in p for p in pieces)

    def test_split_characters_are_held_back(self, bundle: TokenizerBundle) -> None:
        ids = bundle.encode("😀")
        assert len(ids) > 1, "the emoji must span several byte-level tokens for this test"
        detok = IncrementalDetokenizer(bundle)
        assert [detok.add([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
        assert detok.add(ids[-1:]) == "😀"
        assert detok.flush() == ""

    @pytest.mark.parametrize("seed", range(5))
    def test_random_chunk_sizes(self, bundle: TokenizerBundle, seed: int) -> None:
        rng = random.Random(seed)
        ids = bundle.encode("".join(TEXTS))
        sizes: list[int] = []
        while sum(sizes) < len(ids):
            sizes.append(rng.randint(1, 6))
        detok = IncrementalDetokenizer(bundle)
        assert "".join(stream(detok, ids, sizes)) == bundle.decode(ids)

    def test_empty_add(self, bundle: TokenizerBundle) -> None:
        detok = IncrementalDetokenizer(bundle)
        assert detok.add([]) == ""
        assert detok.flush() == ""


class TestRandomIds:
    @pytest.mark.parametrize("seed", range(20))
    @pytest.mark.parametrize("skip", [True, False])
    def test_equals_full_decode(self, bundle: TokenizerBundle, seed: int, skip: bool) -> None:
        rng = random.Random(seed)
        ids = [rng.randrange(bundle.vocab_size) for _ in range(300)]
        detok = IncrementalDetokenizer(bundle, skip_special_tokens=skip)
        out = "".join(stream(detok, ids, [1] * len(ids)))
        assert out == bundle.decode(ids, skip_special_tokens=skip)

    @pytest.mark.parametrize("seed", range(10))
    def test_byte_tokens_only(self, bundle: TokenizerBundle, seed: int) -> None:
        """Single-byte tokens make many split and invalid sequences."""
        byte_ids = [bundle.token_to_id(c) for c in byte_level_alphabet()]
        assert None not in byte_ids and len(byte_ids) == 256
        rng = random.Random(seed)
        ids = [rng.choice(byte_ids) for _ in range(200)]
        detok = IncrementalDetokenizer(bundle)
        assert "".join(stream(detok, ids, [1] * len(ids))) == bundle.decode(ids)


class TestSpecialTokens:
    def test_skipped_by_default(self, bundle: TokenizerBundle) -> None:
        ids = bundle.encode("Hi") + [1]
        detok = IncrementalDetokenizer(bundle)
        assert "".join(stream(detok, ids, [1] * len(ids))) == "Hi"

    def test_kept_on_request(self, bundle: TokenizerBundle) -> None:
        ids = bundle.encode("Hi") + [1]
        detok = IncrementalDetokenizer(bundle, skip_special_tokens=False)
        assert "".join(stream(detok, ids, [1] * len(ids))) == "Hi<｜end▁of▁sentence｜>"

    def test_many_skipped_tokens_then_text(self, bundle: TokenizerBundle) -> None:
        detok = IncrementalDetokenizer(bundle)
        for _ in range(200):
            assert detok.add([0]) == ""
        assert detok.add(bundle.encode("ok")) == "ok"


class TestLongStreams:
    def test_long_output_one_token_at_a_time(self, bundle: TokenizerBundle) -> None:
        ids = bundle.encode(" ".join(TEXTS) * 20)
        assert len(ids) > 500
        detok = IncrementalDetokenizer(bundle)
        assert "".join(stream(detok, ids, [1] * len(ids))) == bundle.decode(ids)

    def test_large_batch_then_small(self, bundle: TokenizerBundle) -> None:
        ids = bundle.encode(TEXTS[0] * 30)
        detok = IncrementalDetokenizer(bundle)
        first = detok.add(ids[:-3])
        rest = detok.add(ids[-3:-1]) + detok.add(ids[-1:]) + detok.flush()
        assert first + rest == bundle.decode(ids)


class TestPromptContext:
    def test_prompt_tail_is_context_only(self, bundle: TokenizerBundle) -> None:
        prompt = bundle.encode("Question: 你好?")
        ids = bundle.encode(" Answer: 世界")
        detok = IncrementalDetokenizer(bundle, prompt_ids=prompt)
        assert "".join(stream(detok, ids, [1] * len(ids))) == " Answer: 世界"

    def test_prompt_ending_inside_a_character(self, bundle: TokenizerBundle) -> None:
        emoji = bundle.encode("😀")
        detok = IncrementalDetokenizer(bundle, prompt_ids=emoji[:1])
        ids = bundle.encode("ok")
        assert "".join(stream(detok, ids, [1] * len(ids))) == "ok"

    def test_flush_of_incomplete_character(self, bundle: TokenizerBundle) -> None:
        emoji = bundle.encode("😀")
        detok = IncrementalDetokenizer(bundle)
        assert detok.add(emoji[:1]) == ""
        assert detok.flush() == bundle.decode(emoji[:1])
        assert detok.flush() == ""
