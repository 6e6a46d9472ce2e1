"""Contracts of KV ingestion: the records every event source produces, the sink they feed
(the index), the counters they share, and what names a worker. Implementations import these,
never the reverse.

Records are msgspec structs shaped as the engines' own events (vLLM's field order), so the ZMQ
decoder turns a payload straight into them in C: `Stored`/`Removed`/`Cleared` are the
tag-first array form, `StoredMap`/`RemovedMap`/`ClearedMap` (subclasses) the `"type"`-keyed
map form; the gRPC source builds the array-form classes. `StoredPacked`/`StoredPackedMap` are
BlockStored with its token ids left as msgpack bytes, for the index to hash in C. Engine block
hashes stay exactly as the engine sent them (an int of either sign, or bytes): they are only
ever compared with other hashes of the same engine stream, so no normalization is needed on
the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

import msgspec

# A routable KV cache: an engine instance and one of its data-parallel ranks (0 without DP).
WorkerKey = tuple[int, int]

EngineHash = int | bytes

# Record kinds (a class attribute: one attribute read dispatches a record in the index).
STORED, REMOVED, CLEARED_KIND = 0, 1, 2


class Stored(msgspec.Struct, array_like=True, tag="BlockStored", gc=False):
    """BlockStored: `block_hashes[i]` covers `token_ids[i*block_size:(i+1)*block_size]`.
    `block_size` 0: the event did not say (the index infers it). `medium` None is the device.
    Trailing fields a given engine version does not send take their defaults."""

    KIND: ClassVar[int] = STORED
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: Any = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None


class StoredPacked(Stored, tag="BlockStored"):
    """BlockStored as the index's decoder reads it (decode.decode_payload_packed):
    `token_ids` is the msgpack array itself, unread, so no Python int is made per token; the
    index hashes the blocks straight from it (switchyard.common._blockhash). Every cell is an
    int or an [int, next] bigram (the decoder checked); other sources build `Stored` with a
    list."""

    # A Raw, not the list[int] of the base class: mypy sees the base's type.
    token_ids: msgspec.Raw = msgspec.Raw(b"\x90")  # type: ignore[assignment]


class Removed(msgspec.Struct, array_like=True, tag="BlockRemoved", gc=False):
    KIND: ClassVar[int] = REMOVED
    block_hashes: list[EngineHash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class Cleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared", gc=False):
    KIND: ClassVar[int] = CLEARED_KIND
    ownership: str | None = None


class StoredMap(Stored, array_like=False, tag_field="type", tag="BlockStored"):
    pass


class StoredPackedMap(StoredPacked, array_like=False, tag_field="type", tag="BlockStored"):
    pass


class RemovedMap(Removed, array_like=False, tag_field="type", tag="BlockRemoved"):
    pass


class ClearedMap(Cleared, array_like=False, tag_field="type", tag="AllBlocksCleared"):
    pass


Record = Stored | Removed | Cleared
CLEARED = Cleared()


class KvSink(Protocol):
    """Where sources put what they read (the KvIndex)."""

    def apply_batch(self, worker: WorkerKey, records: list[Record]) -> None: ...

    def clear_worker(self, worker: WorkerKey) -> None: ...


@dataclass(slots=True)
class KvCounters:
    """Plain counters, shared by the index and every source (read by Prometheus at scrape)."""

    batches_applied: int = 0
    events_applied: int = 0
    blocks_stored: int = 0
    unknown_events: int = 0  # event types we do not know, or malformed events: skipped
    decode_errors: int = 0  # messages or payloads that could not be decoded at all
    unknown_parent: int = 0  # BlockStored whose parent the worker never stored: skipped
    malformed_stored: int = 0  # BlockStored whose token_ids do not cover its blocks: skipped
    skipped_tier: int = 0  # events about blocks on a remote or shared tier: not indexed
    skipped_namespace: int = 0  # BlockStored under a LoRA / cache salt / extra keys
    skipped_group: int = 0  # events of a sliding-window or state-space cache group
    duplicate_stores: int = 0  # a second physical copy of a block the worker holds
    gaps: int = 0  # sequence gaps seen
    resets: int = 0  # sequence went backwards (engine restart): worker cleared
    late_joins: int = 0  # first message had seq > 0
    replays: int = 0  # replay requests made
    replayed_batches: int = 0
    replay_failures: int = 0  # missed batches but no replay endpoint, or replay timed out
    replay_incomplete: int = 0  # replay answered without every missed batch (short buffer)
    unknown_topic: int = 0  # messages on the bound SUB whose topic names no known worker
    stream_restarts: int = 0  # gRPC event streams resubscribed (DATA_LOSS, end, failure)

    reconnects: int = 0  # a source's transport (re)connected: a catch-up from the last seq
    publisher_restarts: int = 0  # a catch-up found the publisher restarted: worker rebuilt
    pre_admission_stores: int = 0  # BlockStored published before fleet admitted the engine
    stale_suspicions: int = 0  # workers whose events stopped while requests ran there

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class WorkerKvStats:
    """One worker's event stream as the router sees it: what staleness views read. Times
    are the router's monotonic clock (`heard_at`, `connected_at`) except `batch_ts`, the
    engine's wall clock stamped on the last batch applied."""

    last_seq: int | None = None  # sequence of the last batch applied
    heard_at: float | None = None  # when the last live message or replayed batch arrived
    batch_ts: float | None = None  # the engine's timestamp on the last batch applied
    lag_s: float = 0.0  # apply time - engine timestamp of the last batch (clock skew included)
    held_since: float | None = None  # a message waits for a replay since then (None: none)
    connected: bool = False  # the transport is connected (a SUB's handshake succeeded)
    reconnects: int = 0
    gaps: int = 0
    replays: int = 0
    resets: int = 0  # the publisher restarted (a sequence back, or found at a catch-up)
    replay_failures: int = 0
    batches: int = 0  # batches applied, live or replayed
    routed_at: float | None = None  # the first request routed here since the last event
    suspected_stale: bool = False  # events stopped while requests run here (KvIngestor)

    def event_age(self, now: float) -> float | None:
        """Seconds since anything arrived (None: nothing yet)."""
        return None if self.heard_at is None else max(0.0, now - self.heard_at)

    def index_lag(self, now: float) -> float:
        """How far behind the engine the index probably is: while a message waits for a
        replay, since when it waits; otherwise the last batch's publish-to-apply delay."""
        return max(0.0, now - self.held_since) if self.held_since is not None else self.lag_s

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
