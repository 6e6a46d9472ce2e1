"""SubscribeKvEvents (common.proto) as the stock servicers (smg-grpc-servicer's relay) answer
it, over the engine's per-rank publishers, for both protocols' servicers.

- No ZMQ publisher configured (no --kv-events-endpoint): UNIMPLEMENTED, as the servicers
  relay the engine's ZMQ publisher and have nothing to relay without one (the servicer
  checks that before calling here).
- `start_sequence_number` other than 0: OUT_OF_RANGE ("resubscribe with zero"): a relay keeps
  nothing between calls to resume from. 0 is live only, from the subscription on.
- One stream carries every data-parallel rank's batches under that rank's own sequence
  numbers, with `dp_rank` on each.
- Events: hashes as the proto's int64 (the u64 bits reinterpreted as two's complement, as the
  relay's `fold_hash` does); blocks on the device: medium "GPU", tier DEVICE, locality LOCAL.
- Load records (`EngineLoad`, the GetLoads figures for the batch's rank) on every batch, the
  telemetry (cache hit rate, token counts) only on the stream's first record and on
  heartbeats; while no batch flows, a `load_only` batch repeating the last sequence and rank
  when the record changed or after `heartbeat_s` of silence (`backoff_s` once two heartbeats
  in a row carried no change), checked every `tick_s`. With
  `load_records_before_first_batch` heartbeats go out before the first batch, numbered 0.
- The stream ends (OK) when the engine stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
from smg_grpc_proto.generated import common_pb2

from switchyard.mock_engine.kv_events import KvEventPublisher
from switchyard.mock_engine.kv_wire import MEDIUM
from switchyard.mock_engine.types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    LoadSnapshot,
)

_SIGN = 1 << 63
_WRAP = 1 << 64
HEARTBEAT_S = 1.0
BACKOFF_S = 5.0
TICK_S = 0.1
_TELEMETRY = ("cache_hit_rate", "num_used_tokens", "max_total_num_tokens")

LoadSource = Callable[[int], common_pb2.EngineLoad]


def to_int64(block_hash: int) -> int:
    """An unsigned 64-bit hash as the signed int64 with the same bits."""
    block_hash &= _WRAP - 1
    return block_hash - _WRAP if block_hash >= _SIGN else block_hash


def load_record(snap: LoadSnapshot, max_running: int) -> common_pb2.EngineLoad:
    """One rank's GetLoads figures as the stream's record."""
    usage = snap.used_tokens / snap.capacity_tokens if snap.capacity_tokens else 0.0
    return common_pb2.EngineLoad(
        running_requests=snap.running_requests,
        waiting_requests=0,
        token_usage=usage,
        gen_throughput=snap.gen_throughput,
        max_running_requests=max_running,
        cache_hit_rate=snap.cache_hit_rate,
        num_used_tokens=snap.used_tokens,
        max_total_num_tokens=snap.capacity_tokens,
    )


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


def batch_proto(
    batch: EventBatch, last_event_id: int = 0, dp_rank: int = 0
) -> common_pb2.KvEventBatch:
    """The proto of `batch`, its events numbered from `last_event_id + 1`."""
    proto = common_pb2.KvEventBatch(sequence_number=batch.seq, timestamp=batch.ts, dp_rank=dp_rank)
    proto.events.extend(
        event_proto(event, last_event_id + i) for i, event in enumerate(batch.events, 1)
    )
    return proto


def _changed(last: common_pb2.EngineLoad | None, now: common_pb2.EngineLoad) -> bool:
    if last is None:
        return True
    return (
        last.running_requests != now.running_requests
        or last.waiting_requests != now.waiting_requests
        or abs(last.token_usage - now.token_usage) > 0.005
    )


class _Records:
    """Numbers and paces one stream's load records."""

    def __init__(self, source: LoadSource, clock: Callable[[], float]) -> None:
        self._source = source
        self._clock = clock
        self.sample = 0
        self.last: common_pb2.EngineLoad | None = None
        self.last_sent = clock()
        self.idle_heartbeats = 0

    def record(self, rank: int, load_only: bool) -> common_pb2.EngineLoad:
        current = self._source(rank)
        record = common_pb2.EngineLoad()
        record.CopyFrom(current)
        self.sample += 1
        record.sample = self.sample
        record.load_only = load_only
        if not load_only and self.sample > 1:
            for name in _TELEMETRY:
                record.ClearField(name)
        self.last = current
        return record

    def heartbeat_due(self, rank: int, heartbeat_s: float, backoff_s: float) -> bool:
        current = self._source(rank)
        changed = _changed(self.last, current)
        due_after = backoff_s if self.idle_heartbeats >= 2 else heartbeat_s
        if not changed and self._clock() - self.last_sent < due_after:
            return False
        self.idle_heartbeats = 0 if changed else self.idle_heartbeats + 1
        return True


async def kv_event_stream(
    publishers: Sequence[KvEventPublisher],
    request: common_pb2.SubscribeKvEventsRequest,
    context: grpc.aio.ServicerContext,
    load_of: LoadSource,
    *,
    heartbeat_s: float = HEARTBEAT_S,
    backoff_s: float = BACKOFF_S,
    tick_s: float = TICK_S,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[common_pb2.KvEventBatch]:
    """The call's batches, every rank's merged; subscribed before the initial metadata goes
    out, so a client that has the metadata misses nothing published afterwards."""
    if request.start_sequence_number:
        await context.abort(
            grpc.StatusCode.OUT_OF_RANGE,
            "KV event replay cursors are per subscription; resubscribe with zero and rebuild",
        )
    merged: asyncio.Queue[tuple[int, EventBatch] | None] = asyncio.Queue()
    subscriptions = [publisher.subscribe(0) for publisher in publishers]

    async def forward(rank: int, subscription: AsyncIterator[EventBatch]) -> None:
        async for batch in subscription:
            merged.put_nowait((rank, batch))

    tasks = [
        asyncio.get_running_loop().create_task(forward(rank, sub))
        for rank, sub in enumerate(subscriptions)
    ]
    ended = asyncio.gather(*tasks, return_exceptions=True)
    ended.add_done_callback(lambda _: merged.put_nowait(None))
    records = _Records(load_of, clock)
    last_seq: int | None = 0 if request.load_records_before_first_batch else None
    last_rank = 0
    event_id = 0
    try:
        await context.send_initial_metadata(())
        while True:
            try:
                async with asyncio.timeout(tick_s):
                    item = await merged.get()
            except TimeoutError:
                if last_seq is not None and records.heartbeat_due(
                    last_rank, heartbeat_s, backoff_s
                ):
                    beat = common_pb2.KvEventBatch(
                        sequence_number=last_seq, timestamp=time.time(), dp_rank=last_rank
                    )
                    beat.load.CopyFrom(records.record(last_rank, load_only=True))
                    records.last_sent = clock()
                    yield beat
                continue
            if item is None:
                return
            rank, batch = item
            proto = batch_proto(batch, event_id, rank)
            event_id += len(batch.events)
            proto.load.CopyFrom(records.record(rank, load_only=False))
            records.last_sent = clock()
            records.idle_heartbeats = 0
            last_seq, last_rank = batch.seq, rank
            yield proto
    finally:
        for subscription in subscriptions:
            subscription.close()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ended
