import msgspec
import pytest

from switchyard.router.kv.decode import (
    END_SEQ,
    decode_payload,
    engine_hash,
    is_end_marker,
    split_frames,
)
from switchyard.router.kv.errors import KvDecodeError
from switchyard.router.kv.tests.wire import (
    END,
    cleared_array,
    payload,
    removed_array,
    removed_map,
    seq_bytes,
    stored_array,
    stored_map,
)
from switchyard.router.kv.types import CLEARED, Cleared, Removed, Stored

BIG = 2**64 - 5  # above 2^63: must stay unsigned


class TestFrames:
    def test_pub_message(self):
        body = payload([cleared_array()])
        assert split_frames([b"kv", seq_bytes(7), body]) == (7, body)

    def test_pub_message_with_empty_topic(self):
        assert split_frames([b"", seq_bytes(0), b"x"]) == (0, b"x")

    def test_replay_reply_three_frames(self):
        assert split_frames([b"", seq_bytes(2**40), b"p"]) == (2**40, b"p")

    def test_replay_reply_with_topic(self):
        assert split_frames([b"", b"topic", seq_bytes(3), b"p"]) == (3, b"p")

    def test_end_marker(self):
        seq, body = split_frames([b"", END, b""])
        assert seq == END_SEQ
        assert is_end_marker(seq, body)
        assert not is_end_marker(5, b"")

    def test_end_marker_with_topic(self):
        assert is_end_marker(*split_frames([b"", b"t", END, b""]))

    @pytest.mark.parametrize(
        "frames", [[b"only"], [], [b"", b"\x00\x01", b"p"], [b"t", b"123456789", b"p"]]
    )
    def test_bad_framing(self, frames):
        with pytest.raises(KvDecodeError):
            split_frames(frames)


def as_dict(record):
    """A record's fields, whatever its wire form (array- and map-form classes differ)."""
    return {"kind": record.KIND, **msgspec.structs.asdict(record)}


def stored(hashes, parent, tokens, size, **kw):
    return as_dict(Stored(hashes, parent, tokens, size, **kw))


class TestArrayEvents:
    def test_block_stored(self):
        batch = decode_payload(payload([stored_array([BIG, 2], None, [1, 2, 3, 4], 2)]))
        assert [as_dict(r) for r in batch.records] == [
            stored([BIG, 2], None, [1, 2, 3, 4], 2, medium="GPU")
        ]
        assert batch.skipped == 0
        assert batch.timestamp == 1.5
        assert batch.dp_rank == 0

    def test_block_stored_with_parent_and_vllm_trailing_fields(self):
        event = stored_array(
            [5], BIG, [9, 9], 2, None, "GPU", None, [None], 1, "full_attention", None, "x", "y"
        )
        [record] = decode_payload(payload([event])).records
        assert record.parent_block_hash == BIG
        assert record.block_hashes == [5]
        assert record.group_idx == 1
        assert record.kv_cache_spec_kind == "full_attention"

    def test_block_stored_older_shape_without_lora_and_medium(self):
        event = ["BlockStored", [1], None, [1, 2], 2]
        [record] = decode_payload(payload([event])).records
        assert as_dict(record) == stored([1], None, [1, 2], 2)

    def test_lora_and_offloaded_medium(self):
        event = stored_array([1], None, [1, 2], 2, 3, "CPU")
        [record] = decode_payload(payload([event])).records
        assert record.lora_id == 3
        assert record.medium == "CPU"

    def test_block_removed(self):
        batch = decode_payload(payload([removed_array([BIG, 1]), ["BlockRemoved", [2]]]))
        assert [as_dict(r) for r in batch.records] == [
            as_dict(Removed([BIG, 1], "GPU")),
            as_dict(Removed([2])),
        ]

    def test_removed_with_group(self):
        [record] = decode_payload(payload([["BlockRemoved", [1], "GPU", 2]])).records
        assert record.group_idx == 2

    def test_all_blocks_cleared(self):
        batch = decode_payload(payload([cleared_array(), ["AllBlocksCleared"]]))
        assert [r.KIND for r in batch.records] == [CLEARED.KIND, CLEARED.KIND]
        assert isinstance(batch.records[0], Cleared)


class TestMapEvents:
    def test_block_stored(self):
        event = stored_map([BIG], 17, [1, 2], 2, unknown_key=[1, 2], extra_keys=None)
        [record] = decode_payload(payload([event])).records
        assert as_dict(record) == stored([BIG], 17, [1, 2], 2, medium="GPU")

    def test_block_stored_without_block_size(self):
        event = stored_map([1], None, [1, 2], 2)
        del event["block_size"]
        [record] = decode_payload(payload([event])).records
        assert record.block_size == 0  # the index infers it

    def test_lora_name_group_and_kind(self):
        event = stored_map(
            [1], None, [1, 2], 2, lora_name="adapter", group_idx=1, kv_cache_spec_kind="mamba"
        )
        [record] = decode_payload(payload([event])).records
        assert (record.lora_name, record.group_idx, record.kv_cache_spec_kind) == (
            "adapter",
            1,
            "mamba",
        )

    def test_block_removed_and_cleared(self):
        events = [removed_map([3, 4], future=True), {"type": "AllBlocksCleared", "x": 1}]
        records = decode_payload(payload(events)).records
        assert [as_dict(r) for r in records] == [as_dict(Removed([3, 4], "GPU")), as_dict(CLEARED)]


class TestHashes:
    """Engine hashes are kept as sent: they are only compared within one engine's stream."""

    def test_u64_above_2_63(self):
        [record] = decode_payload(payload([removed_array([2**64 - 1, 2**63])])).records
        assert record.block_hashes == [2**64 - 1, 2**63]

    def test_negative_int64_kept(self):
        [record] = decode_payload(payload([stored_array([-1], -2, [1], 1)])).records
        assert record.block_hashes == [-1]
        assert record.parent_block_hash == -2

    def test_bytes_kept(self):
        digest = bytes(range(32))
        [record] = decode_payload(payload([stored_array([digest, 5], digest, [1, 2], 1)])).records
        assert record.block_hashes == [digest, 5]
        assert record.parent_block_hash == digest

    def test_engine_hash(self):
        assert engine_hash(b"\x01\x02") == b"\x01\x02"
        assert engine_hash(-3) == -3
        with pytest.raises(ValueError):
            engine_hash(b"")

    def test_bigram_token_cells_fold_to_their_tokens(self):
        """Eagle speculative decoding sends [token, next_token] cells."""
        [record] = decode_payload(payload([stored_array([1], None, [[5, 6], [7, 8]], 2)])).records
        assert record.token_ids == [5, 7]


class TestBatch:
    def test_missing_dp_rank(self):
        batch = decode_payload(payload([cleared_array()], dp_rank=None))
        assert batch.dp_rank is None
        assert [r.KIND for r in batch.records] == [CLEARED.KIND]

    def test_extra_trailing_items(self):
        body = msgspec.msgpack.encode([1.0, [cleared_array()], 2, "future", {"a": 1}])
        batch = decode_payload(body)
        assert batch.dp_rank == 2
        assert [r.KIND for r in batch.records] == [CLEARED.KIND]

    def test_mixed_encodings_in_one_batch(self):
        events = [stored_array([1], None, [1], 1), removed_map([1]), cleared_array()]
        assert len(decode_payload(payload(events)).records) == 3

    def test_unknown_and_malformed_events_are_skipped_and_counted(self):
        events = [
            ["FutureEvent", 1, 2],
            {"type": "Unheard"},
            {"no_type": 1},
            [],
            "text",
            7,
            ["BlockStored", [1]],  # too short
            ["BlockStored", [1], None, "not tokens", 1],
            ["BlockStored", [1.5], None, [1], 1],  # float hash
            {"type": "BlockRemoved"},  # no block_hashes
            cleared_array(),
        ]
        batch = decode_payload(payload(events))
        assert [r.KIND for r in batch.records] == [CLEARED.KIND]
        assert batch.skipped == 10

    @pytest.mark.parametrize(
        "body",
        [
            b"\xc1",  # never-used msgpack byte
            b"",
            msgspec.msgpack.encode({"ts": 1}),
            msgspec.msgpack.encode([1.0]),
            msgspec.msgpack.encode([1.0, "events"]),
        ],
    )
    def test_not_a_batch(self, body):
        with pytest.raises(KvDecodeError):
            decode_payload(body)


class TestMapEnvelope:
    def test_batch_sent_as_a_map(self):
        """vLLM's KVEventBatch without array_like encodes the envelope as a map."""
        raw = msgspec.msgpack.encode(
            {"ts": 1.5, "events": [{"type": "AllBlocksCleared"}], "data_parallel_rank": 0}
        )
        batch = decode_payload(raw)
        assert [r.KIND for r in batch.records] == [CLEARED.KIND]
        assert batch.dp_rank == 0

    def test_vllm_map_envelope_with_map_events(self):
        raw = msgspec.msgpack.encode(
            {
                "ts": 1.5,
                "events": [stored_map([1, 2], None, [1, 2, 3, 4], 2), removed_map([2])],
                "data_parallel_rank": 3,
            }
        )
        batch = decode_payload(raw)
        assert [r.KIND for r in batch.records] == [0, 1]
        assert batch.dp_rank == 3


class TestPackedTokenIds:
    """decode_payload_packed: records as decode_payload's, BlockStored's token ids left as the
    msgpack array (for the index's C hash) when every cell is a token."""

    @pytest.fixture(autouse=True)
    def _native(self):
        from switchyard.common.block_hash import NATIVE

        if not NATIVE:
            pytest.skip("the C extension is not built: decode_payload_packed is decode_payload")

    @staticmethod
    def folded(record):
        fields = as_dict(record)
        tokens = fields.get("token_ids")
        if type(tokens) is msgspec.Raw:
            cells = msgspec.msgpack.decode(tokens)
            fields["token_ids"] = [c[0] if type(c) is list else c for c in cells]
        return fields

    @pytest.mark.parametrize(
        "events",
        [
            [stored_array([BIG, 2], None, [1, 2, 3, 4], 2), removed_array([3])],
            [stored_map([5], BIG, [2**32 - 1, 0], 2, medium="CPU"), removed_map([5])],
            [stored_array([1], None, [[5, 6], [7, "x"]], 2)],  # bigram cells
            [stored_array([1], None, [1, -1], 2)],  # outside u32: the index's malformed event
            [["BlockStored", [1], None]],  # no token ids: the default, an empty array
        ],
    )
    def test_same_records_as_decode_payload(self, events):
        from switchyard.router.kv.decode import decode_payload_packed

        body = payload(events)
        listed, packed = decode_payload(body), decode_payload_packed(body)
        assert (packed.timestamp, packed.dp_rank, packed.skipped) == (
            listed.timestamp,
            listed.dp_rank,
            listed.skipped,
        )
        assert [self.folded(r) for r in packed.records] == [as_dict(r) for r in listed.records]
        assert all(
            type(r.token_ids) is msgspec.Raw for r in packed.records if r.KIND == Stored.KIND
        )

    @pytest.mark.parametrize("cell", ["7", 1.5, None, True, [1], [1, 2, 3], ["a", 1]])
    def test_a_cell_that_is_not_a_token_skips_its_event(self, cell):
        from switchyard.router.kv.decode import decode_payload_packed

        body = payload([stored_array([1], None, [1, cell], 2), cleared_array()])
        batch = decode_payload_packed(body)
        assert [r.KIND for r in batch.records] == [CLEARED.KIND]
        assert batch.skipped == 1 == decode_payload(body).skipped
