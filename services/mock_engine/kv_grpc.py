"""SubscribeKvEvents (common.proto) over the publisher, for both protocols' servicers.

Each batch goes out under the publisher's own sequence number with dp_rank 0; events are
numbered per stream from 1 (`event_id`). Hashes are carried as the proto's int64: the u64 bits
reinterpreted as two's complement, as the real servicer's `to_int64` does. Blocks are on the
device: medium "GPU", tier DEVICE, locality LOCAL, as the real relay normalizes them.
start_sequence_number 0 is live only; N > 0 replays the buffer from N first, and a start the
buffer no longer holds ends the call with OUT_OF_RANGE. The stream ends (OK) when the engine
stops. The events are served whether or not a ZMQ endpoint is configured; no load records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from smg_grpc_proto.generated import common_pb2

from switchyard.mock_engine.errors import KvHistoryTruncated
from switchyard.mock_engine.kv_events import KvEventPublisher
from switchyard.mock_engine.kv_wire import MEDIUM
from switchyard.mock_engine.types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
)

_SIGN = 1 << 63
_WRAP = 1 << 64


def to_int64(block_hash: int) -> int:
    """An unsigned 64-bit hash as the signed int64 with the same bits."""
    block_hash &= _WRAP - 1
    return block_hash - _WRAP if block_hash >= _SIGN else block_hash


def event_proto(event: KvEvent, event_id: int) -> common_pb2.KvCacheEvent:
    if isinstance(event, BlockStored):
        size = event.block_size
        blocks = [
            common_pb2.KvBlock(
                block_hash=to_int64(block_hash),
                token_ids=event.token_ids[i * size : (i + 1) * size],
                block_size=size,
            )
            for i, block_hash in enumerate(event.block_hashes)
        ]
        stored = common_pb2.KvBlocksStored(
            blocks=blocks,
            tier=common_pb2.KV_CACHE_TIER_DEVICE,
            medium=MEDIUM,
            locality=common_pb2.KV_CACHE_LOCALITY_LOCAL,
        )
        if event.parent_block_hash is not None:
            stored.parent_block_hash = to_int64(event.parent_block_hash)
        return common_pb2.KvCacheEvent(event_id=event_id, stored=stored)
    if isinstance(event, BlockRemoved):
        removed = common_pb2.KvBlocksRemoved(
            block_hashes=[to_int64(h) for h in event.block_hashes],
            tier=common_pb2.KV_CACHE_TIER_DEVICE,
            medium=MEDIUM,
            locality=common_pb2.KV_CACHE_LOCALITY_LOCAL,
        )
        return common_pb2.KvCacheEvent(event_id=event_id, removed=removed)
    if isinstance(event, AllBlocksCleared):
        return common_pb2.KvCacheEvent(event_id=event_id, cleared=common_pb2.KvCacheCleared())
    raise TypeError(f"not a KV event: {event!r}")  # pragma: no cover - KvEvent is closed


def batch_proto(batch: EventBatch, last_event_id: int = 0) -> common_pb2.KvEventBatch:
    """The proto of `batch`, its events numbered from `last_event_id + 1`."""
    proto = common_pb2.KvEventBatch(sequence_number=batch.seq, timestamp=batch.ts, dp_rank=0)
    proto.events.extend(
        event_proto(event, last_event_id + i) for i, event in enumerate(batch.events, 1)
    )
    return proto


async def kv_event_stream(
    publisher: KvEventPublisher,
    request: common_pb2.SubscribeKvEventsRequest,
    context: grpc.aio.ServicerContext,
) -> AsyncIterator[common_pb2.KvEventBatch]:
    """The call's batches; subscribed before the initial metadata goes out, so a client that
    has the metadata misses nothing published afterwards."""
    try:
        subscription = publisher.subscribe(request.start_sequence_number)
    except KvHistoryTruncated as exc:
        await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
    event_id = 0
    try:
        await context.send_initial_metadata(())
        async for batch in subscription:
            yield batch_proto(batch, event_id)
            event_id += len(batch.events)
    finally:
        subscription.close()
