"""PromptEncoder: the same ids as one full encode, cached pieces, cheap refusals."""

from __future__ import annotations

import random

import pytest

from switchyard.preprocessor.prompt_encoder import (
    PromptEncoder,
    PromptTooLong,
    max_token_bytes,
    splitting_tokens,
)
from switchyard.preprocessor.tokenizer import TokenizerBundle

WORDS = [
    "hello",
    " world",
    "你好",
    "😀",
    "\n\n",
    "  ",
    "def f(x):",
    "<｜User｜>",
    "naïve",
    "123456",
]


def conversation(rng: random.Random, bundle: TokenizerBundle, turns: int) -> str:
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        text = "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 30)))
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return bundle.chat_template.render(messages)


def full(bundle: TokenizerBundle, text: str) -> list[int]:
    return bundle.tokenizer.encode(text, add_special_tokens=False).ids


class TestSameIds:
    @pytest.mark.parametrize("seed", range(30))
    async def test_random_conversations(self, bundle: TokenizerBundle, seed: int) -> None:
        rng = random.Random(seed)
        text = conversation(rng, bundle, rng.randint(1, 12))
        encoder = bundle.prompts
        assert await encoder.encode(text, 10**9, offload_chars=10**9) == full(bundle, text)

    async def test_special_tokens_next_to_spaces_and_each_other(self, bundle: TokenizerBundle):
        for text in [
            "<｜User｜> a <｜Assistant｜>",
            "<｜User｜><｜User｜>",
            " <｜end▁of▁sentence｜>\n",
            "<｜begin▁of▁sentence｜>",
            "x<｜User｜",
        ]:
            assert await bundle.prompts.encode(text, 10**9, 10**9) == full(bundle, text)

    async def test_offloaded_gives_the_same_ids(self, bundle: TokenizerBundle) -> None:
        text = conversation(random.Random(7), bundle, 10)
        assert await bundle.prompts.encode(text, 10**9, offload_chars=0) == full(bundle, text)

    def test_only_safe_tokens_split(self, bundle: TokenizerBundle) -> None:
        tok = bundle.tokenizer
        assert "<｜User｜>" in splitting_tokens(tok, ["<｜User｜>", "not a token"])
        assert splitting_tokens(tok, ["not a token"]) == []


class TestCache:
    async def test_the_next_turn_tokenizes_only_what_is_new(self, bundle: TokenizerBundle):
        encoder = PromptEncoder(
            bundle.tokenizer, ["<｜User｜>", "<｜Assistant｜>"], bundle.prompts.max_token_bytes
        )
        history = [{"role": "system", "content": "a long system prompt " * 20}]
        for turn in range(5):
            history += [
                {"role": "user", "content": f"question {turn} " * 10},
                {"role": "assistant", "content": f"answer {turn} " * 10},
            ]
            text = bundle.chat_template.render(history)
            misses = encoder.misses
            assert await encoder.encode(text, 10**9, 10**9) == full(bundle, text)
            new_pieces = encoder.misses - misses
            assert new_pieces <= (3 if turn == 0 else 2)  # this turn's question and answer
        assert encoder.hits > 0

    async def test_bounded(self, bundle: TokenizerBundle) -> None:
        encoder = PromptEncoder(bundle.tokenizer, ["<｜User｜>"], 128, cache_chars=1000)
        for i in range(50):
            await encoder.encode(f"<｜User｜>message number {i} " * 5, 10**9, 10**9)
        assert encoder.cached_chars() <= 1000


class TestRefusals:
    async def test_bytes_bound_refuses_without_tokenizing(self, bundle: TokenizerBundle):
        encoder = bundle.prompts
        misses = encoder.misses
        with pytest.raises(PromptTooLong) as info:
            await encoder.encode("a" * 5_000_000, 1000, 10**9)
        assert encoder.misses == misses
        assert info.value.tokens > 1000

    async def test_prefix_refusal(self, bundle: TokenizerBundle) -> None:
        with pytest.raises(PromptTooLong):
            await bundle.prompts.encode("x y " * 20_000, 1000, 10**9)

    async def test_a_fitting_prompt_is_not_refused(self, bundle: TokenizerBundle) -> None:
        text = "word " * 3000
        ids = await bundle.prompts.encode(text, len(full(bundle, text)), 10**9)
        assert ids == full(bundle, text)

    def test_max_token_bytes(self, bundle: TokenizerBundle) -> None:
        longest = max_token_bytes(bundle.tokenizer)
        assert longest == bundle.prompts.max_token_bytes >= 16
