"""The C extension (libs/common/_blockhash.c) against xxhash and the Python definitions."""

import random
import struct

import msgspec
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from switchyard.common import block_hash
from switchyard.common.block_hash import SEED, py_block_hashes, py_chain_hashes

native = block_hash.native
pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built")

SIZES = [1, 16, 32, 64, 128]
U64 = 2**64 - 1


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [
        rng.choice((rng.randrange(128), rng.randrange(2**16), rng.randrange(2**32)))
        for _ in range(n)
    ]


class TestXxh3:
    def test_every_length_to_2048_matches_xxhash(self):
        """Every length branch: 0, 1-3, 4-8, 9-16, 17-128, 129-240 and the long hash (with
        a seed-derived secret, and several 1024-byte blocks)."""
        rng = random.Random(0)
        data = rng.randbytes(2048)
        seeds = [0, SEED, U64, rng.getrandbits(64), rng.getrandbits(64)]
        for n in range(2049):
            chunk = data[:n]
            for seed in seeds:
                assert native.xxh3_64(chunk, seed) == xxhash.xxh3_64_intdigest(chunk, seed), (
                    n,
                    seed,
                )

    def test_default_seed_is_zero(self):
        assert native.xxh3_64(b"switchyard") == xxhash.xxh3_64_intdigest(b"switchyard")

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=5000), st.integers(0, U64))
    def test_any_bytes_and_seed(self, data, seed):
        assert native.xxh3_64(data, seed) == xxhash.xxh3_64_intdigest(data, seed)

    def test_buffers(self):
        data = bytes(range(200))
        assert native.xxh3_64(memoryview(data)[3:150], SEED) == xxhash.xxh3_64_intdigest(
            data[3:150], SEED
        )


class TestBlockHashes:
    @pytest.mark.parametrize("size", SIZES)
    def test_matches_python(self, size):
        rng = random.Random(size)
        for _ in range(20):
            tokens = random_tokens(rng, rng.randrange(0, 6 * size + 3))
            parent = rng.choice([None, 0, rng.getrandbits(64), U64])
            assert native.block_hashes(tokens, size, parent) == py_block_hashes(
                tokens, size, parent
            )

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(st.integers(0, 2**32 - 1), max_size=300),
        st.integers(1, 70),
        st.none() | st.integers(0, U64),
    )
    def test_any_tokens(self, tokens, size, parent):
        assert native.block_hashes(tokens, size, parent=parent) == py_block_hashes(
            tokens, size, parent
        )

    def test_live_when_built(self):
        assert block_hash.NATIVE
        assert block_hash.block_hashes is native.block_hashes

    def test_sequences_other_than_lists(self):
        tokens = list(range(40))
        expected = py_block_hashes(tokens, 8)
        assert native.block_hashes(tuple(tokens), 8) == expected
        assert native.block_hashes(range(40), 8) == expected

    def test_bools_pack_as_ints_as_array_does(self):
        assert native.block_hashes([True, 0], 2) == py_block_hashes([True, 0], 2)

    @pytest.mark.parametrize("token", [-1, 2**32, 2**64, -(2**70)])
    def test_token_outside_u32(self, token):
        with pytest.raises(ValueError):
            native.block_hashes([1, token], 2)

    @pytest.mark.parametrize("token", ["7", 1.0, None, [1]])
    def test_token_not_an_int(self, token):
        with pytest.raises(TypeError):
            py_block_hashes([1, token], 2)
        with pytest.raises(TypeError):
            native.block_hashes([1, token], 2)

    def test_partial_tail_is_not_read(self):
        assert native.block_hashes([1, 2, -5], 2) == py_block_hashes([1, 2, -5], 2)

    @pytest.mark.parametrize("size", [0, -3])
    def test_block_size_below_one(self, size):
        with pytest.raises(ValueError):
            native.block_hashes([1, 2], size)

    def test_parent_outside_u64(self):
        with pytest.raises(OverflowError):
            native.block_hashes([1, 2], 2, 2**64)


class TestChainHashes:
    @pytest.mark.parametrize("size", SIZES)
    def test_matches_python(self, size):
        rng = random.Random(size)
        step = 4 * size
        n = 7
        data = rng.randbytes(step * n)
        for start in range(n + 1):
            parent = None if start == 0 else rng.getrandbits(64)
            assert native.chain_hashes(data, step, start, n, parent) == py_chain_hashes(
                data, step, start, n, parent
            )

    def test_blocks_outside_the_data(self):
        with pytest.raises(ValueError):
            native.chain_hashes(b"\0" * 8, 4, 0, 3, None)


def array_header(n: int, form: str) -> bytes:
    if form == "fix" and n < 16:
        return bytes([0x90 | n])
    if form in ("fix", "16") and n < 2**16:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


def int_cell(value: int, rng: random.Random) -> bytes:
    """`value` in one of the msgpack int encodings that can hold it (signed ones too)."""
    forms = []
    if 0 <= value < 128:
        forms.append(bytes([value]))
    if -32 <= value < 0:
        forms.append(struct.pack(">b", value))
    for tag, fmt in ((0xCC, ">B"), (0xCD, ">H"), (0xCE, ">I"), (0xCF, ">Q")):
        try:
            forms.append(bytes([tag]) + struct.pack(fmt, value))
        except struct.error:
            pass
    for tag, fmt in ((0xD0, ">b"), (0xD1, ">h"), (0xD2, ">i"), (0xD3, ">q")):
        try:
            forms.append(bytes([tag]) + struct.pack(fmt, value))
        except struct.error:
            pass
    return rng.choice(forms)


def token_array(tokens: list, rng: random.Random, form: str = "fix") -> bytes:
    """A msgpack array of token cells: ints in any encoding, or [token, anything] bigrams."""
    out = [array_header(len(tokens), form)]
    for cell in tokens:
        if type(cell) is list:
            second = msgspec.msgpack.encode(cell[1])
            out.append(b"\x92" + int_cell(cell[0], rng) + second)
        else:
            out.append(int_cell(cell, rng))
    return b"".join(out)


def folded(tokens: list) -> list[int]:
    return [cell[0] if type(cell) is list else cell for cell in tokens]


class TestMsgpackBlockHashes:
    @pytest.mark.parametrize("size", SIZES)
    @pytest.mark.parametrize("form", ["fix", "16", "32"])
    def test_matches_python_on_every_encoding(self, size, form):
        rng = random.Random(size)
        for _ in range(10):
            n = rng.randrange(0, 5)
            tokens: list = random_tokens(rng, n * size + rng.randrange(0, size))
            for i in range(0, len(tokens), 3):
                if rng.random() < 0.3:
                    tokens[i] = [tokens[i], rng.choice([7, "x", None, [1, 2], {"a": 1.5}])]
            raw = msgspec.Raw(token_array(tokens, rng, form))
            parent = rng.choice([None, rng.getrandbits(64)])
            expected = py_block_hashes(folded(tokens), size, parent)
            assert native.msgpack_block_hashes(raw, size, parent) == expected
            assert native.token_count(raw) == len(tokens)
            assert native.check_token_cells(raw) == len(tokens)

    def test_msgspec_encoding(self):
        tokens = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1] * 4
        raw = msgspec.msgpack.encode(tokens)
        assert native.msgpack_block_hashes(raw, 16, parent=5) == py_block_hashes(tokens, 16, 5)

    def test_parent_chains(self):
        rng = random.Random(3)
        tokens = random_tokens(rng, 64)
        head = native.msgpack_block_hashes(msgspec.msgpack.encode(tokens[:32]), 16)
        tail = native.msgpack_block_hashes(msgspec.msgpack.encode(tokens[32:]), 16, head[-1])
        assert head + tail == py_block_hashes(tokens, 16)

    @pytest.mark.parametrize("token", [-1, 2**32, 2**64 - 1, -(2**63)])
    def test_ints_outside_u32_are_value_errors(self, token):
        raw = msgspec.msgpack.encode([1, token])
        with pytest.raises(ValueError):
            native.msgpack_block_hashes(raw, 2)
        assert native.check_token_cells(raw) == 2  # the index's malformed event, not a shape

    def test_bigram_with_token_outside_u32(self):
        raw = msgspec.msgpack.encode([[2**40, 1], 3])
        with pytest.raises(ValueError):
            native.msgpack_block_hashes(raw, 2)

    @pytest.mark.parametrize(
        "cell", ["7", 1.5, None, True, b"\x01", [1], [1, 2, 3], [[1, 2], 3], ["a", 1], {"a": 1}]
    )
    def test_cells_that_are_not_tokens(self, cell):
        raw = msgspec.msgpack.encode([1, cell])
        with pytest.raises(TypeError):
            native.check_token_cells(raw)
        with pytest.raises(TypeError):
            native.msgpack_block_hashes(raw, 2)

    @pytest.mark.parametrize("value", ["tokens", 5, None, {"a": 1}])
    def test_not_an_array(self, value):
        raw = msgspec.msgpack.encode(value)
        for fn in (native.token_count, native.check_token_cells):
            with pytest.raises(TypeError):
                fn(raw)

    @pytest.mark.parametrize(
        "raw", [b"", b"\x93\x01", b"\xdc\x00", b"\x91\xcd\x01", b"\x91\x92\x01"]
    )
    def test_truncated(self, raw):
        with pytest.raises(ValueError):
            native.check_token_cells(raw)

    def test_only_full_blocks_are_read(self):
        raw = msgspec.msgpack.encode([1, 2, "tail"])
        assert native.msgpack_block_hashes(raw, 2) == py_block_hashes([1, 2], 2)

    @pytest.mark.parametrize("size", [0, -1])
    def test_block_size_below_one(self, size):
        with pytest.raises(ValueError):
            native.msgpack_block_hashes(msgspec.msgpack.encode([1, 2]), size)

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.integers(0, 2**32 - 1)
            | st.tuples(st.integers(0, 2**32 - 1), st.integers(-(2**63), U64)),
            max_size=200,
        ),
        st.integers(1, 40),
    )
    def test_any_cells(self, cells, size):
        tokens = [list(c) if type(c) is tuple else c for c in cells]
        raw = msgspec.msgpack.encode(tokens)
        assert native.msgpack_block_hashes(raw, size) == py_block_hashes(folded(tokens), size)
