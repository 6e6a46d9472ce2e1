"""Contracts of KV ingestion: the records every event source produces, the sink they feed
(the index), and the counters they share. Implementations import these, never the reverse.

Records are small frozen msgspec structs (cheap to create, no GC tracking): one per engine
event, whatever the wire (ZMQ msgpack arrays or maps, gRPC KvCacheEvent). Hashes in them are
the engine's opaque block hashes as unsigned 64-bit ints.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol

import msgspec


class Stored(msgspec.Struct, frozen=True, gc=False):
    """BlockStored: `block_hashes[i]` covers `token_ids[i*block_size:(i+1)*block_size]`.
    `block_size` is 0 when the event did not say (the index infers it). `device` is False for
    blocks on another tier (host memory, disk, a remote pool); `namespace` is the LoRA id/name
    or cache salt the engine hashed under (None for the base model)."""

    block_hashes: list[int]
    parent: int | None
    token_ids: list[int]
    block_size: int
    device: bool = True
    namespace: int | str | None = None


class Removed(msgspec.Struct, frozen=True, gc=False):
    block_hashes: list[int]
    device: bool = True


class Cleared(msgspec.Struct, frozen=True, gc=False):
    pass


Record = Stored | Removed | Cleared
CLEARED = Cleared()


class KvSink(Protocol):
    """Where sources put what they read (the KvIndex)."""

    def apply_batch(self, instance_id: int, records: list[Record]) -> None: ...

    def clear_worker(self, instance_id: int) -> None: ...


@dataclass(slots=True)
class KvCounters:
    """Plain counters, shared by the index and every source (Prometheus is wired later)."""

    batches_applied: int = 0
    events_applied: int = 0
    unknown_events: int = 0  # event types we do not know, or malformed events: skipped
    decode_errors: int = 0  # messages or payloads that could not be decoded at all
    unknown_parent: int = 0  # BlockStored whose parent the worker never stored: skipped
    malformed_stored: int = 0  # BlockStored whose token_ids do not cover its blocks: skipped
    skipped_tier: int = 0  # events about blocks off the device: not indexed
    skipped_namespace: int = 0  # BlockStored under a LoRA / cache salt: not indexed
    gaps: int = 0  # sequence gaps seen
    resets: int = 0  # sequence went backwards (engine restart): worker cleared
    late_joins: int = 0  # first message had seq > 0
    replays: int = 0  # replay requests made
    replayed_batches: int = 0
    replay_failures: int = 0  # missed batches but no replay endpoint, or replay timed out
    replay_incomplete: int = 0  # replay answered without every missed batch (short buffer)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
