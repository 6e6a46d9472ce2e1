import random

import pytest

from switchyard.common.block_hash import block_hashes
from switchyard.router.prompt_hashes import PromptHashes


def tokens(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(200_000) for _ in range(n)]


class TestPromptHashes:
    def test_same_hashes_as_the_shared_definition(self):
        cache = PromptHashes()
        system = tokens(1, 1000)
        prompts = [
            system + tokens(2, 77),
            system + tokens(2, 77) + tokens(3, 300),  # the next turn
            system + tokens(4, 50),  # another conversation, same system prompt
            system[:500] + [7] + system[501:],  # differs inside a block
            tokens(5, 10),  # shorter than a block
            system[: 16 * 3],  # exactly three blocks
        ]
        for size in (16, 4, 1):
            for p in prompts:
                assert cache.hashes(p, size) == block_hashes(p, size)

    def test_the_next_turn_reuses_the_previous_hashes(self):
        cache = PromptHashes()
        turn = tokens(1, 4096)
        cache.hashes(turn, 16)
        before = cache.hashed_blocks
        cache.hashes(turn + tokens(2, 160), 16)
        assert cache.hashed_blocks - before == 1 + 10  # the first block and the new ones
        assert cache.reused_blocks == 255

    def test_memory_is_bounded(self):
        cache = PromptHashes(entries=4, per_key=2)
        for seed in range(20):
            cache.hashes(tokens(seed, 64), 16)
        assert len(cache._lru) == 4

    def test_bad_input(self):
        with pytest.raises(ValueError):
            PromptHashes().hashes([1, 2], 0)
        with pytest.raises(ValueError):
            PromptHashes().hashes([2**33] * 16, 16)


class TestLazyBlocks:
    def test_hashed_only_as_deep_as_read(self):
        cache = PromptHashes()
        prompt = tokens(1, 16 * 100)
        blocks = cache.blocks(prompt, 16)
        assert len(blocks) == 100 and blocks.known == block_hashes(prompt[:16], 16)
        assert cache.hashed_blocks == 1
        assert blocks.upto(40)[:40] == block_hashes(prompt, 16)[:40]
        assert cache.hashed_blocks == 40
        assert list(blocks) == block_hashes(prompt, 16) and cache.hashed_blocks == 100
        assert blocks == block_hashes(prompt, 16) and blocks[-1] == block_hashes(prompt, 16)[-1]

    def test_a_later_prompt_reuses_what_an_earlier_one_hashed_since(self):
        cache = PromptHashes()
        system = tokens(1, 16 * 50)
        first = cache.blocks(system + tokens(2, 64), 16)
        first.upto(30)  # read after it was remembered
        second = cache.blocks(system + tokens(3, 64), 16)
        assert second.known == block_hashes(system, 16)[:30]  # reused, not rehashed
        assert list(second) == block_hashes(system + tokens(3, 64), 16)

    def test_empty_and_short_prompts(self):
        cache = PromptHashes()
        assert len(cache.blocks([1, 2, 3], 16)) == 0 and not cache.blocks([1, 2, 3], 16)
        assert cache.hashes([1, 2, 3], 16) == []
