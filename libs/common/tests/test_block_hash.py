import struct

import pytest
import xxhash

from switchyard.common.block_hash import SEED, block_hash, block_hashes


def reference(token_ids: list[int], block_size: int, parent: int | None = None) -> list[int]:
    """The documented definition, spelled out with struct."""
    out = []
    for i in range(len(token_ids) // block_size):
        data = struct.pack(f"<{block_size}I", *token_ids[i * block_size : (i + 1) * block_size])
        if parent is not None:
            data = struct.pack("<Q", parent) + data
        parent = xxhash.xxh3_64_intdigest(data, seed=SEED)
        out.append(parent)
    return out


class TestDefinition:
    def test_root_block_is_xxh3_of_le_u32_tokens_with_seed_1337(self):
        tokens = [1, 2, 3, 0xFFFF_FFFF]
        expected = xxhash.xxh3_64_intdigest(
            b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\xff\xff\xff\xff", seed=1337
        )
        assert block_hashes(tokens, 4) == [expected]

    def test_child_prefixes_the_parent_hash_as_8_le_bytes(self):
        root = block_hash([5, 6])
        child = xxhash.xxh3_64_intdigest(
            root.to_bytes(8, "little") + b"\x07\x00\x00\x00\x08\x00\x00\x00", seed=1337
        )
        assert block_hashes([5, 6, 7, 8], 2) == [root, child]

    def test_matches_reference_for_many_blocks(self):
        tokens = [(i * 7919) % 151_000 for i in range(1000)]
        assert block_hashes(tokens, 16) == reference(tokens, 16)

    def test_hashes_are_u64(self):
        hashes = block_hashes(list(range(4096)), 4)
        assert all(0 <= h < 2**64 for h in hashes)
        assert any(h >= 2**63 for h in hashes)


class TestChaining:
    def test_continuing_a_chain_equals_hashing_it_whole(self):
        tokens = list(range(64))
        whole = block_hashes(tokens, 8)
        head = block_hashes(tokens[:24], 8)
        assert head + block_hashes(tokens[24:], 8, parent=head[-1]) == whole

    def test_same_block_under_another_prefix_differs(self):
        a = block_hashes([1, 1, 9, 9], 2)
        b = block_hashes([2, 2, 9, 9], 2)
        assert a[1] != b[1]

    def test_root_is_not_a_zero_parent(self):
        assert block_hash([3, 4]) != block_hash([3, 4], parent=0)

    def test_parent_above_2_63(self):
        parent = 2**64 - 1
        assert block_hashes([1, 2], 2, parent) == reference([1, 2], 2, parent)


class TestFullBlocksOnly:
    def test_partial_tail_ignored(self):
        assert block_hashes(list(range(35)), 16) == block_hashes(list(range(32)), 16)

    def test_shorter_than_a_block(self):
        assert block_hashes([1, 2, 3], 16) == []

    def test_accepts_tuples(self):
        assert block_hashes((1, 2, 3, 4), 2) == block_hashes([1, 2, 3, 4], 2)


class TestBadInput:
    @pytest.mark.parametrize("size", [0, -1])
    def test_block_size_below_one(self, size):
        with pytest.raises(ValueError):
            block_hashes([1, 2], size)

    @pytest.mark.parametrize("token", [-1, 2**32])
    def test_token_outside_u32(self, token):
        with pytest.raises(ValueError):
            block_hashes([token, 1], 2)

    def test_empty_block(self):
        with pytest.raises(ValueError):
            block_hash([])
