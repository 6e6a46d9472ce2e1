"""One engine's KV events over its gRPC SubscribeKvEvents stream: the fallback for engines that
advertise no ZMQ endpoint. Produces the same records as the ZMQ decoder.

KvEventBatch handling:
- `load.load_only` batches carry no events and repeat the last sequence: ignored here.
- A batch whose sequence goes backwards is a restarted engine: the worker is cleared first.
  A gap is counted (the stream is in-order and lossless while it lasts; a lost stream is
  resubscribed from the next sequence).
- Snapshot chunks (a relay's state resync, chunk 0 starting with AllBlocksCleared) apply as
  they come; their sequences are not checked against ours.
- Hashes are int64 on this wire: mapped to u64 like the ZMQ decoder's negative ints.

UNIMPLEMENTED ends the source (the engine has no KV events); other stream errors resubscribe
with a capped backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from smg_grpc_proto.generated import common_pb2

from switchyard.common.engines.base import EngineClient
from switchyard.router.kv.decode import OFF_DEVICE, U64
from switchyard.router.kv.types import CLEARED, KvCounters, KvSink, Record, Removed, Stored

log = logging.getLogger(__name__)

_REMOTE = common_pb2.KV_CACHE_LOCALITY_REMOTE
_DEVICE_TIERS = (common_pb2.KV_CACHE_TIER_UNSPECIFIED, common_pb2.KV_CACHE_TIER_DEVICE)


def convert_batch(batch: common_pb2.KvEventBatch) -> tuple[list[Record], int]:
    """(records, events skipped) of one batch."""
    records: list[Record] = []
    skipped = 0
    for event in batch.events:
        record = convert_event(event)
        if record is None:
            skipped += 1
        else:
            records.append(record)
    return records, skipped


def convert_event(event: common_pb2.KvCacheEvent) -> Record | None:
    which = event.WhichOneof("data")
    if which == "stored":
        stored = event.stored
        blocks = stored.blocks
        tokens: list[int] = []
        for block in blocks:
            tokens.extend(block.token_ids)
        first = blocks[0] if blocks else None
        return Stored(
            block_hashes=[block.block_hash & U64 for block in blocks],
            parent=stored.parent_block_hash & U64 if stored.HasField("parent_block_hash") else None,
            token_ids=tokens,
            block_size=first.block_size if first is not None else 0,
            device=_on_device(stored, first),
            namespace=_namespace(stored, first),
        )
    if which == "removed":
        removed = event.removed
        return Removed([h & U64 for h in removed.block_hashes], _on_device(removed, removed))
    if which == "cleared":
        return CLEARED
    return None


def _on_device(msg: Any, level_holder: Any) -> bool:
    """Device tier unless the message says otherwise (locality, medium, tier, cache_level)."""
    if msg.HasField("locality") and msg.locality == _REMOTE:
        return False
    if msg.HasField("medium") and msg.medium:
        return msg.medium.upper() not in OFF_DEVICE
    if msg.HasField("tier"):
        return msg.tier in _DEVICE_TIERS
    if level_holder is not None and level_holder.HasField("cache_level"):
        return level_holder.cache_level == 0
    return True


def _namespace(stored: common_pb2.KvBlocksStored, first: common_pb2.KvBlock | None) -> object:
    if stored.lora_name:
        return stored.lora_name
    if stored.cache_salt:
        return "salt:" + stored.cache_salt
    if first is not None and first.HasField("lora_id") and first.lora_id:
        return first.lora_id
    return None


class GrpcKvSource:
    def __init__(
        self,
        instance_id: int,
        client: EngineClient,
        sink: KvSink,
        counters: KvCounters,
        *,
        owns_client: bool = True,
        retry_first: float = 0.5,
        retry_max: float = 5.0,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        """`client`: an SGLang or vLLM EngineClient (its `stub` has SubscribeKvEvents); closed
        when the source ends if `owns_client`."""
        self.instance_id = instance_id
        self._client = client
        self._sink = sink
        self._counters = counters
        self._owns_client = owns_client
        self._retry_first = retry_first
        self._retry_max = retry_max
        self._sleep = sleep
        self._last: int | None = None

    @property
    def last_seq(self) -> int | None:
        return self._last

    async def run(self) -> None:
        """Follow the stream until cancelled, or until the engine says it has none."""
        self._sink.clear_worker(self.instance_id)
        stub = self._client.stub  # type: ignore[attr-defined]
        delay = self._retry_first
        try:
            while True:
                start = 0 if self._last is None else self._last + 1
                call = stub.SubscribeKvEvents(
                    common_pb2.SubscribeKvEventsRequest(start_sequence_number=start)
                )
                try:
                    async for batch in call:
                        delay = self._retry_first
                        self.on_batch(batch)
                    log.info("kv event stream ended instance_id=%d", self.instance_id)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                        log.info(
                            "engine publishes no KV events over gRPC instance_id=%d",
                            self.instance_id,
                        )
                        return
                    log.warning(
                        "kv event stream failed instance_id=%d: %s %s",
                        self.instance_id,
                        exc.code().name,
                        exc.details(),
                    )
                finally:
                    call.cancel()
                await self._sleep(delay)
                delay = min(delay * 2, self._retry_max)
        finally:
            if self._owns_client:
                await self._client.close()

    def on_batch(self, batch: common_pb2.KvEventBatch) -> None:
        if batch.HasField("load") and batch.load.load_only:
            return
        seq = batch.sequence_number
        last = self._last
        counters = self._counters
        if not batch.HasField("snapshot"):
            if last is None:
                if seq > 0:
                    counters.late_joins += 1
            elif seq <= last:
                counters.resets += 1
                log.info(
                    "kv events reset instance_id=%d last=%d seq=%d: clearing worker",
                    self.instance_id,
                    last,
                    seq,
                )
                self._sink.clear_worker(self.instance_id)
            elif seq > last + 1:
                counters.gaps += 1
                log.info("kv events gap instance_id=%d last=%d seq=%d", self.instance_id, last, seq)
        records, skipped = convert_batch(batch)
        if skipped:
            counters.unknown_events += skipped
        self._last = seq
        self._sink.apply_batch(self.instance_id, records)
