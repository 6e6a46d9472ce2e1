"""Engine KV-event messages (ZMQ frames + msgpack payload) -> internal records.

Framing (ARCHITECTURE.md, "KV events"):
    PUB            [topic, seq, payload]        (topic may be empty)
    replay reply   [b"", seq, payload]  or  [b"", topic, seq, payload]
    replay end     seq = eight 0xFF bytes, empty payload
so the sequence number (8-byte big-endian) is always the next-to-last frame and the payload
the last one.

Payload: msgpack `[timestamp, [events...], dp_rank]` (dp_rank may be missing, trailing items
are ignored), or the same as a map `{"ts", "events", "data_parallel_rank"}` (vLLM's
EventBatch is not array-like). Each event is either a tag-first array read by position
(trailing fields ignored, missing trailing fields defaulted), in vLLM's field order:
    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
     lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, ...]
    ["BlockRemoved", block_hashes, medium, group_idx, ...]
    ["AllBlocksCleared", ...]
or a map with a "type" key and the same field names (unknown keys ignored).

Fast path: msgspec decodes the payload straight into the record structs (types.py), trying
the four envelope/event shapes, the one that worked last first. Anything they refuse (an
unknown event type, a bigram token cell, a field of another shape) goes through the lenient
path, which decodes generically and converts event by event: an event of an unknown type, or
a known one with fields of the wrong shape, is skipped and counted in `DecodedBatch.skipped`;
only a payload that is not a batch at all raises KvDecodeError.

`decode_payload_packed` (what the subscriber uses) is the same, but leaves a BlockStored's
token ids as their msgpack array (types.StoredPacked) for the index to hash in C;
`decode_payload` gives them as lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from switchyard.common.block_hash import native
from switchyard.router.kv.errors import KvDecodeError
from switchyard.router.kv.types import (
    CLEARED,
    STORED,
    Cleared,
    ClearedMap,
    Record,
    Removed,
    RemovedMap,
    Stored,
    StoredMap,
    StoredPacked,
    StoredPackedMap,
)

END_SEQ = 0xFFFF_FFFF_FFFF_FFFF  # sequence field of the replay end marker (-1 as int64)
U64 = 0xFFFF_FFFF_FFFF_FFFF


class DecodedBatch(NamedTuple):
    timestamp: Any
    records: list[Record]
    dp_rank: int | None
    skipped: int  # events of unknown type or malformed: not in `records`


def _typed_decoders(stored: type[Stored], stored_map: type[Stored]) -> list[Any]:
    """msgpack decoders of the four envelope/event shapes (array or map envelope, of array
    or map events), for one pair of BlockStored classes."""
    arrays = list[stored | Removed | Cleared]  # type: ignore[valid-type]
    maps = list[stored_map | RemovedMap | ClearedMap]  # type: ignore[valid-type]

    def decoder(array_envelope: bool, events: Any) -> Any:
        fields: list[Any] = (
            [("ts", Any), ("events", events), ("dp_rank", Any, None)]
            if array_envelope
            else [("events", events), ("ts", Any, None), ("data_parallel_rank", Any, None)]
        )
        batch = msgspec.defstruct("Batch", fields, array_like=array_envelope, gc=False)
        return msgspec.msgpack.Decoder(batch)

    return [
        decoder(True, maps),
        decoder(True, arrays),
        decoder(False, maps),
        decoder(False, arrays),
    ]


# In this order: the first two are array envelopes (`dp_rank`), the last two map envelopes.
_TYPED = _typed_decoders(Stored, StoredMap)
_PACKED = _typed_decoders(StoredPacked, StoredPackedMap)
_generic = msgspec.msgpack.Decoder()
_first = [0]  # index into _TYPED of the shape that decoded last (publishers keep one shape)
_first_packed = [0]
check_token_cells = native.check_token_cells if native is not None else None


def split_frames(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """(sequence, payload) of a PUB message or a replay reply."""
    if len(frames) < 2:
        raise KvDecodeError(f"KV-event message has {len(frames)} frame(s), expected 3 or 4")
    seq = frames[-2]
    if len(seq) != 8:
        raise KvDecodeError(f"KV-event sequence frame is {len(seq)} bytes, expected 8")
    return int.from_bytes(seq, "big"), frames[-1]


def is_end_marker(seq: int, payload: bytes) -> bool:
    return seq == END_SEQ and not payload


def decode_payload(payload: bytes) -> DecodedBatch:
    """Decode one batch payload. Raises KvDecodeError when it is not a batch."""
    return _decode_typed(payload, _TYPED, _first) or _decode_lenient(payload)


def decode_payload_packed(payload: bytes) -> DecodedBatch:
    """As decode_payload, for the index: a BlockStored's token ids stay the msgpack array
    they came as (`StoredPacked.token_ids`, a msgspec.Raw) when every cell is a token, so
    the index hashes them in C without a Python int per token. The lenient path (a batch the
    typed decoders refuse, or a cell that is not a token) gives lists, as decode_payload
    does; so does a build without the C extension."""
    if check_token_cells is None:
        return decode_payload(payload)
    batch = _decode_typed(payload, _PACKED, _first_packed)
    if batch is None:
        return _decode_lenient(payload)
    try:
        for record in batch.records:
            if record.KIND == STORED:
                check_token_cells(record.token_ids)  # type: ignore[union-attr, arg-type]
    except (TypeError, ValueError):  # a cell _token refuses: the lenient path skips the event
        return _decode_lenient(payload)
    return batch


def _decode_typed(
    payload: bytes, decoders: list[Any], first_shape: list[int]
) -> DecodedBatch | None:
    """The batch by the first of the four typed shapes that fits (trying the one that worked
    last first); None when none does."""
    first = first_shape[0]
    for attempt in range(4):
        which = (first + attempt) & 3
        try:
            batch = decoders[which].decode(payload)
        except msgspec.ValidationError:
            continue
        except msgspec.DecodeError as exc:
            raise KvDecodeError(f"undecodable KV-event payload: {exc}") from exc
        first_shape[0] = which
        rank = batch.dp_rank if which < 2 else batch.data_parallel_rank
        return DecodedBatch(batch.ts, batch.events, rank if type(rank) is int else None, 0)
    return None


def _decode_lenient(payload: bytes) -> DecodedBatch:
    try:
        batch = _generic.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvDecodeError(f"undecodable KV-event payload: {exc}") from exc
    if type(batch) is dict:
        batch = [batch.get("ts"), batch.get("events"), batch.get("data_parallel_rank")]
    if type(batch) is not list or len(batch) < 2 or type(batch[1]) is not list:
        raise KvDecodeError("KV-event payload is not [timestamp, [events...], dp_rank]")
    dp_rank = batch[2] if len(batch) > 2 and type(batch[2]) is int else None
    records: list[Record] = []
    skipped = 0
    for event in batch[1]:
        try:
            record = _event(event)
        except (TypeError, ValueError, IndexError, KeyError, AttributeError):
            record = None
        if record is None:
            skipped += 1
        else:
            records.append(record)
    return DecodedBatch(batch[0], records, dp_rank, skipped)


_STORED_SLOTS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
)
_REMOVED_SLOTS = ("block_hashes", "medium", "group_idx", "locality", "ownership")


def _event(event: Any) -> Record | None:
    if type(event) is list:
        if not event or type(event[0]) is not str:
            return None
        tag = event[0]
        if tag == "BlockStored":
            return _stored(dict(zip(_STORED_SLOTS, event[1:], strict=False)))
        if tag == "BlockRemoved":
            return _removed(dict(zip(_REMOVED_SLOTS, event[1:], strict=False)))
        return CLEARED if tag == "AllBlocksCleared" else None
    if type(event) is dict:
        kind = event.get("type")
        if kind == "BlockStored":
            return _stored(event)
        if kind == "BlockRemoved":
            return _removed(event)
        return CLEARED if kind == "AllBlocksCleared" else None
    return None


def _text(value: Any) -> str | None:
    return value if type(value) is str else None


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _token(cell: Any) -> int:
    # Eagle-family speculative decoding may send [token, next_token] cells: the token counts.
    if type(cell) is list and len(cell) == 2:
        cell = cell[0]
    if type(cell) is not int:
        raise TypeError("token id is not an int")
    return cell


def _stored(fields: dict[str, Any]) -> Stored:
    tokens = fields["token_ids"]
    if type(tokens) is not list:
        raise TypeError("token_ids is not an array")
    block_size = fields.get("block_size")
    if block_size is not None and type(block_size) is not int:
        raise TypeError("block_size is not an int")
    parent = fields.get("parent_block_hash")
    lora_id = fields.get("lora_id")
    return Stored(
        block_hashes=engine_hashes(fields["block_hashes"]),
        parent_block_hash=None if parent is None else engine_hash(parent),
        token_ids=[_token(t) for t in tokens],
        block_size=block_size or 0,
        # A LoRA named by a string id still puts the blocks under its namespace.
        lora_id=None if lora_id is None else (lora_id if type(lora_id) is int else -1),
        medium=_text(fields.get("medium")),
        lora_name=_text(fields.get("lora_name")),
        extra_keys=fields.get("extra_keys"),
        group_idx=_int(fields.get("group_idx")),
        kv_cache_spec_kind=_text(fields.get("kv_cache_spec_kind")),
        locality=_text(fields.get("locality")),
        ownership=_text(fields.get("ownership")),
    )


def _removed(fields: dict[str, Any]) -> Removed:
    return Removed(
        engine_hashes(fields["block_hashes"]),
        medium=_text(fields.get("medium")),
        group_idx=_int(fields.get("group_idx")),
        locality=_text(fields.get("locality")),
        ownership=_text(fields.get("ownership")),
    )


def engine_hashes(raw: Any) -> list[int | bytes]:
    if type(raw) is not list:
        raise TypeError("block_hashes is not an array")
    return [engine_hash(h) for h in raw]


def engine_hash(raw: Any) -> int | bytes:
    """An engine block hash as an index key: ints as sent, bytes as bytes (never empty)."""
    if type(raw) is int:
        return raw
    if isinstance(raw, bytes | bytearray | memoryview):
        value = bytes(raw)
        if not value:
            raise ValueError("empty block hash")
        return value
    raise TypeError(f"block hash of type {type(raw).__name__}")
