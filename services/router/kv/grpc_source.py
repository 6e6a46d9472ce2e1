"""One engine's KV events over its gRPC SubscribeKvEvents stream: the fallback for engines that
advertise no ZMQ endpoint. Produces the same records as the ZMQ decoder, and hands the load
records the stream carries to `on_load`.

What the stock servicers (smg-grpc-servicer's relay) do, and what this source relies on:
- One stream carries every data-parallel rank's batches under that rank's own sequence
  numbers, `dp_rank` on each batch: a cursor per rank (worker (instance, rank)).
- `start_sequence_number` 0 is live only (no history); any other start is refused with
  OUT_OF_RANGE. So every (re)subscription starts from 0 and from an empty view of every rank.
- A gap the relay cannot fill and a restarted publisher end the stream with DATA_LOSS: the
  workers are cleared and the source resubscribes. A sequence that goes backwards on a rank
  is a restart too (cleared); a forward jump is counted as a gap.
- No publisher configured: UNIMPLEMENTED, which ends the source (the engine has no events).
- Every batch may carry the engine's load (`EngineLoad`, the GetLoads figures for its rank);
  `load_only` batches carry nothing else and repeat the last sequence.
- Of a hybrid model's cache groups only main-attention ones are forwarded; tiers come as
  `tier` / `medium` / `cache_level`, locality and ownership as on the ZMQ wire.
- Snapshot chunks (a relay's state resync) apply as they come, sequences unchecked.
- Hashes are int64 on this wire; they are used as they come (consistent within the stream).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from smg_grpc_proto.generated import common_pb2

from switchyard.common.engines.base import EngineClient
from switchyard.router.kv.types import CLEARED, Cleared, KvCounters, KvSink, Record, Removed, Stored

log = logging.getLogger(__name__)

_TIER_MEDIUM = {
    common_pb2.KV_CACHE_TIER_HOST: "CPU",
    common_pb2.KV_CACHE_TIER_DISK: "DISK",
    common_pb2.KV_CACHE_TIER_EXTERNAL: "EXTERNAL",
}
_LEVEL_MEDIUM = {1: "CPU", 2: "DISK", 3: "EXTERNAL"}

OnLoad = Callable[[int, common_pb2.EngineLoad], None]


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


def _medium(msg: Any, level_holder: Any) -> str | None:
    if msg.HasField("medium") and msg.medium:
        return str(msg.medium)
    if msg.HasField("tier"):
        return _TIER_MEDIUM.get(msg.tier)
    if level_holder is not None and level_holder.HasField("cache_level"):
        return _LEVEL_MEDIUM.get(level_holder.cache_level)
    return None


def _locality(msg: Any) -> str | None:
    if msg.HasField("locality") and msg.locality == common_pb2.KV_CACHE_LOCALITY_REMOTE:
        return "REMOTE"
    return None


def _optional(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def convert_event(event: common_pb2.KvCacheEvent) -> Record | None:
    which = event.WhichOneof("data")
    if which == "stored":
        stored = event.stored
        blocks = stored.blocks
        tokens: list[int] = []
        for block in blocks:
            tokens.extend(block.token_ids)
        first = blocks[0] if blocks else None
        lora_id = first.lora_id if first is not None and first.HasField("lora_id") else None
        extra = (
            [list(b.extra_keys) or None for b in blocks]
            if any(b.extra_keys for b in blocks)
            else None
        )
        return Stored(
            block_hashes=[block.block_hash for block in blocks],
            parent_block_hash=_optional(stored, "parent_block_hash"),
            token_ids=tokens,
            block_size=first.block_size if first is not None else 0,
            lora_id=lora_id or None,
            medium=_medium(stored, first),
            lora_name=_optional(stored, "lora_name") or None,
            extra_keys=extra or ([stored.cache_salt] if stored.cache_salt else None),
            group_idx=_optional(stored, "group_idx"),
            kv_cache_spec_kind=_optional(stored, "kv_cache_spec_kind"),
            locality=_locality(stored),
            ownership=_optional(stored, "ownership"),
        )
    if which == "removed":
        removed = event.removed
        return Removed(
            list(removed.block_hashes),
            medium=_medium(removed, removed),
            group_idx=_optional(removed, "group_idx"),
            locality=_locality(removed),
            ownership=_optional(removed, "ownership"),
        )
    if which == "cleared":
        ownership = _optional(event.cleared, "ownership")
        return CLEARED if ownership is None else Cleared(ownership)
    return None


class GrpcKvSource:
    def __init__(
        self,
        instance_id: int,
        client: EngineClient,
        sink: KvSink,
        counters: KvCounters,
        *,
        on_load: OnLoad | None = None,
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
        self._on_load = on_load
        self._owns_client = owns_client
        self._retry_first = retry_first
        self._retry_max = retry_max
        self._sleep = sleep
        self._last: dict[int, int] = {}  # rank -> last sequence applied
        self._ranks: set[int] = set()  # ranks seen since the first subscription
        self.batches = 0  # batches with events received
        self.unimplemented = False  # the engine said it has no KV events
        self.on_contact: Callable[[], None] | None = None

    def last_seq(self, rank: int = 0) -> int | None:
        return self._last.get(rank)

    async def run(self) -> None:
        """Follow the stream until cancelled, or until the engine says it has none."""
        stub = self._client.stub  # type: ignore[attr-defined]
        delay = self._retry_first
        try:
            while True:
                self._reset()
                call = stub.SubscribeKvEvents(
                    common_pb2.SubscribeKvEventsRequest(
                        start_sequence_number=0, load_records_before_first_batch=True
                    )
                )
                try:
                    async for batch in call:
                        delay = self._retry_first
                        self.on_batch(batch)
                    log.info("kv event stream ended instance_id=%d", self.instance_id)
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
                    if code == grpc.StatusCode.UNIMPLEMENTED:
                        self.unimplemented = True
                        log.info(
                            "engine publishes no KV events instance_id=%d: %s",
                            self.instance_id,
                            exc.details(),
                        )
                        return
                    level = logging.INFO if code == grpc.StatusCode.DATA_LOSS else logging.WARNING
                    log.log(
                        level,
                        "kv event stream ended instance_id=%d: %s %s; resubscribing",
                        self.instance_id,
                        code.name,
                        exc.details(),
                    )
                finally:
                    call.cancel()
                self._counters.stream_restarts += 1
                await self._sleep(delay)
                delay = min(delay * 2, self._retry_max)
        finally:
            if self._owns_client:
                await self._client.close()

    def _reset(self) -> None:
        """A new subscription is live only: start from an empty view of every rank."""
        for rank in self._ranks or {0}:
            self._sink.clear_worker((self.instance_id, rank))
        self._last.clear()

    def on_batch(self, batch: common_pb2.KvEventBatch) -> None:
        rank = batch.dp_rank if batch.HasField("dp_rank") else 0
        if batch.HasField("load") and self._on_load is not None:
            self._on_load(rank, batch.load)
        if batch.HasField("load") and batch.load.load_only:
            return
        worker = (self.instance_id, rank)
        if rank not in self._ranks:
            self._ranks.add(rank)
        seq = batch.sequence_number
        counters = self._counters
        if not batch.HasField("snapshot"):
            last = self._last.get(rank)
            if last is None:
                if seq > 0:
                    counters.late_joins += 1
            elif seq <= last:
                counters.resets += 1
                log.info(
                    "kv events reset instance_id=%d rank=%d last=%d seq=%d: clearing worker",
                    self.instance_id,
                    rank,
                    last,
                    seq,
                )
                self._sink.clear_worker(worker)
            elif seq > last + 1:
                counters.gaps += 1
                log.info(
                    "kv events gap instance_id=%d rank=%d last=%d seq=%d",
                    self.instance_id,
                    rank,
                    last,
                    seq,
                )
            self._last[rank] = seq
        records, skipped = convert_batch(batch)
        if skipped:
            counters.unknown_events += skipped
        self.batches += 1
        if self.batches == 1 and self.on_contact is not None:
            self.on_contact()
        self._sink.apply_batch(worker, records)
