"""The PUB payload decoded with plain msgpack: both event forms, the three hash forms."""

from __future__ import annotations

import msgspec

from switchyard.mock_engine.config import EventFormat, HashForm
from switchyard.mock_engine.kv_wire import WireEncoder
from switchyard.mock_engine.types import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

BIG = (1 << 64) - 5  # above 2^63
SMALL = 12345
BATCH = EventBatch(
    seq=3,
    ts=1700000000.25,
    events=(
        BlockStored((SMALL, BIG), None, tuple(range(8)), 4),
        BlockStored((7,), BIG, (8, 9, 10, 11), 4),
        BlockRemoved((BIG,)),
        AllBlocksCleared(),
    ),
)


def decode(payload: bytes) -> list[object]:
    value = msgspec.msgpack.decode(payload)
    assert isinstance(value, list)
    return value


class TestMapForm:
    def test_payload_and_events(self) -> None:
        ts, events, rank = decode(WireEncoder()(BATCH))
        assert ts == 1700000000.25 and rank == 0
        assert events == [
            {
                "type": "BlockStored",
                "block_hashes": [SMALL, BIG],
                "parent_block_hash": None,
                "token_ids": list(range(8)),
                "block_size": 4,
                "lora_id": None,
                "medium": "GPU",
            },
            {
                "type": "BlockStored",
                "block_hashes": [7],
                "parent_block_hash": BIG,
                "token_ids": [8, 9, 10, 11],
                "block_size": 4,
                "lora_id": None,
                "medium": "GPU",
            },
            {"type": "BlockRemoved", "block_hashes": [BIG], "medium": "GPU"},
            {"type": "AllBlocksCleared"},
        ]


class TestArrayForm:
    def test_tag_first_arrays(self) -> None:
        ts, events, rank = decode(WireEncoder(EventFormat.ARRAY)(BATCH))
        assert ts == 1700000000.25 and rank == 0
        assert events == [
            ["BlockStored", [SMALL, BIG], None, list(range(8)), 4, None, "GPU"],
            ["BlockStored", [7], BIG, [8, 9, 10, 11], 4, None, "GPU"],
            ["BlockRemoved", [BIG], "GPU"],
            ["AllBlocksCleared"],
        ]


class TestHashForms:
    def test_bytes(self) -> None:
        _, events, _ = decode(WireEncoder(hash_form=HashForm.BYTES)(BATCH))
        assert isinstance(events, list)
        assert events[0]["block_hashes"] == [SMALL.to_bytes(8, "big"), BIG.to_bytes(8, "big")]
        assert events[1]["parent_block_hash"] == BIG.to_bytes(8, "big")
        assert events[2]["block_hashes"] == [BIG.to_bytes(8, "big")]

    def test_signed(self) -> None:
        _, events, _ = decode(WireEncoder(EventFormat.ARRAY, HashForm.INT)(BATCH))
        assert isinstance(events, list)
        assert events[0][1] == [SMALL, BIG - (1 << 64)]
        assert events[1][2] == -5
