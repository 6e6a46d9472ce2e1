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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from switchyard.router.kv.errors import KvDecodeError
from switchyard.router.kv.types import (
    CLEARED,
    Cleared,
    ClearedMap,
    Record,
    Removed,
    RemovedMap,
    Stored,
    StoredMap,
)

END_SEQ = 0xFFFF_FFFF_FFFF_FFFF  # sequence field of the replay end marker (-1 as int64)
U64 = 0xFFFF_FFFF_FFFF_FFFF


class DecodedBatch(NamedTuple):
    timestamp: Any
    records: list[Record]
    dp_rank: int | None
    skipped: int  # events of unknown type or malformed: not in `records`


class _ArrayArray(msgspec.Struct, array_like=True, gc=False):
    ts: Any
    events: list[Stored | Removed | Cleared]
    dp_rank: Any = None


class _ArrayMap(msgspec.Struct, array_like=True, gc=False):
    ts: Any
    events: list[StoredMap | RemovedMap | ClearedMap]
    dp_rank: Any = None


class _MapMap(msgspec.Struct, gc=False):
    events: list[StoredMap | RemovedMap | ClearedMap]
    ts: Any = None
    data_parallel_rank: Any = None


class _MapArray(msgspec.Struct, gc=False):
    events: list[Stored | Removed | Cleared]
    ts: Any = None
    data_parallel_rank: Any = None


_TYPED: list[msgspec.msgpack.Decoder[Any]] = [
    msgspec.msgpack.Decoder(_ArrayMap),
    msgspec.msgpack.Decoder(_ArrayArray),
    msgspec.msgpack.Decoder(_MapMap),
    msgspec.msgpack.Decoder(_MapArray),
]
_generic = msgspec.msgpack.Decoder()
_first = [0]  # index into _TYPED of the shape that decoded last (publishers keep one shape)


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
    first = _first[0]
    for attempt in range(4):
        which = (first + attempt) & 3
        try:
            batch = _TYPED[which].decode(payload)
        except msgspec.ValidationError:
            continue
        except msgspec.DecodeError as exc:
            raise KvDecodeError(f"undecodable KV-event payload: {exc}") from exc
        _first[0] = which
        rank = batch.dp_rank if which < 2 else batch.data_parallel_rank
        return DecodedBatch(
            batch.ts,
            batch.events,
            rank if type(rank) is int else None,
            0,  # type: ignore[arg-type]
        )
    return _decode_lenient(payload)


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
