"""Engine KV-event messages (ZMQ frames + msgpack payload) -> internal records.

Framing (ARCHITECTURE.md, "KV events"):
    PUB            [topic, seq, payload]        (topic may be empty)
    replay reply   [b"", seq, payload]  or  [b"", topic, seq, payload]
    replay end     seq = eight 0xFF bytes, empty payload
so the sequence number (8-byte big-endian) is always the next-to-last frame and the payload
the last one.

Payload: msgpack `[timestamp, [events...], dp_rank]` (dp_rank may be missing, trailing items
are ignored). Each event is either a tag-first array read by position (trailing fields
ignored):
    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]
    ["BlockRemoved", block_hashes, medium, ...]
    ["AllBlocksCleared", ...]
or a map with a "type" key and the same field names (unknown keys ignored). Block hashes are
u64 ints (possibly >= 2^63), negative ints (an int64 two's complement: mapped to u64) or bytes
(the last 8 bytes, big-endian). An event of an unknown type, or a known one with fields of the
wrong shape, is skipped and counted in `DecodedBatch.skipped`; only a payload that is not a
batch at all raises KvDecodeError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from switchyard.router.kv.errors import KvDecodeError
from switchyard.router.kv.types import CLEARED, Record, Removed, Stored

END_SEQ = 0xFFFF_FFFF_FFFF_FFFF  # sequence field of the replay end marker (-1 as int64)
U64 = 0xFFFF_FFFF_FFFF_FFFF

# Tiers that are not the engine's device memory: vLLM CPU / STORAGE, SGLang CPU_PINNED / DISK /
# EXTERNAL. Anything else (GPU, or a device name we do not know) counts as device: a tier we
# fail to recognise must not silently empty the index.
OFF_DEVICE = frozenset({"CPU", "CPU_PINNED", "DISK", "STORAGE", "EXTERNAL", "HOST", "REMOTE"})

_decoder = msgspec.msgpack.Decoder()


class DecodedBatch(NamedTuple):
    timestamp: Any
    records: list[Record]
    dp_rank: int | None
    skipped: int  # events of unknown type or malformed: not in `records`


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
    try:
        batch = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvDecodeError(f"undecodable KV-event payload: {exc}") from exc
    if type(batch) is dict:
        # A publisher whose batch struct is not array-like sends the envelope as a map.
        batch = [batch.get("ts"), batch.get("events"), batch.get("data_parallel_rank")]
    if type(batch) is not list or len(batch) < 2 or type(batch[1]) is not list:
        raise KvDecodeError("KV-event payload is not [timestamp, [events...], dp_rank]")
    dp_rank = batch[2] if len(batch) > 2 and type(batch[2]) is int else None
    records: list[Record] = []
    append = records.append
    skipped = 0
    for event in batch[1]:
        try:
            record = _event(event)
        except (TypeError, ValueError, IndexError, KeyError, AttributeError):
            record = None
        if record is None:
            skipped += 1
        else:
            append(record)
    return DecodedBatch(batch[0], records, dp_rank, skipped)


def _event(event: Any) -> Record | None:
    kind = type(event)
    if kind is list:
        tag = event[0]
        n = len(event)
        if tag == "BlockStored":
            return _stored(
                event[1],
                event[2],
                event[3],
                event[4] if n > 4 else None,
                event[5] if n > 5 else None,
                event[6] if n > 6 else None,
            )
        if tag == "BlockRemoved":
            return _removed(event[1], event[2] if n > 2 else None)
        if tag == "AllBlocksCleared":
            return CLEARED
        return None
    if kind is dict:
        tag = event.get("type")
        if tag == "BlockStored":
            return _stored(
                event["block_hashes"],
                event.get("parent_block_hash"),
                event["token_ids"],
                event.get("block_size"),
                event.get("lora_id")
                if event.get("lora_id") is not None
                else event.get("lora_name"),
                event.get("medium"),
            )
        if tag == "BlockRemoved":
            return _removed(event["block_hashes"], event.get("medium"))
        if tag == "AllBlocksCleared":
            return CLEARED
    return None


def _stored(
    hashes: Any, parent: Any, token_ids: Any, block_size: Any, lora: Any, medium: Any
) -> Stored:
    if type(token_ids) is not list:
        raise TypeError("token_ids is not an array")
    if block_size is not None and type(block_size) is not int:
        raise TypeError("block_size is not an int")
    return Stored(
        block_hashes=engine_hashes(hashes),
        parent=None if parent is None else engine_hash(parent),
        token_ids=token_ids,
        block_size=block_size or 0,
        device=_on_device(medium),
        namespace=lora,
    )


def _removed(hashes: Any, medium: Any) -> Removed:
    return Removed(engine_hashes(hashes), _on_device(medium))


def _on_device(medium: Any) -> bool:
    return medium is None or type(medium) is not str or medium.upper() not in OFF_DEVICE


def engine_hashes(raw: Any) -> list[int]:
    """A list of engine block hashes as u64 ints (see the module docstring)."""
    if type(raw) is not list:
        raise TypeError("block_hashes is not an array")
    try:
        return [h & U64 for h in raw]  # the common case: all ints
    except TypeError:
        return [engine_hash(h) for h in raw]


def engine_hash(raw: Any) -> int:
    if type(raw) is int:
        return raw & U64
    if isinstance(raw, bytes | bytearray | memoryview):
        tail = bytes(raw)[-8:]
        if not tail:
            raise ValueError("empty block hash")
        return int.from_bytes(tail, "big")
    raise TypeError(f"block hash of type {type(raw).__name__}")
