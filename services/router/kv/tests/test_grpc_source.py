import asyncio
import contextlib

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2 as cpb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sg_grpc

from switchyard.common.block_hash import block_hashes
from switchyard.common.engines.sglang import SglangClient
from switchyard.router.kv.grpc_source import GrpcKvSource, convert_event
from switchyard.router.kv.index import DEVICE, OFFLOADED, SKIP, KvIndex, tier_of
from switchyard.router.kv.tests.wire import free_port, until
from switchyard.router.kv.types import CLEARED

BS = 4
PROMPT = list(range(1, 17))  # 4 blocks
OWN = block_hashes(PROMPT, BS)
IID = 3
WORKER = (IID, 0)
HOLD = object()  # a script item: keep the stream open from here on


def stored(hashes, parent, tokens, **fields):
    blocks = [
        cpb.KvBlock(block_hash=h, token_ids=tokens[i * BS : (i + 1) * BS], block_size=BS)
        for i, h in enumerate(hashes)
    ]
    return cpb.KvCacheEvent(
        stored=cpb.KvBlocksStored(blocks=blocks, parent_block_hash=parent, **fields)
    )


def batch(seq, *events, **fields):
    return cpb.KvEventBatch(sequence_number=seq, timestamp=1.0, events=events, **fields)


class TestConvert:
    def test_stored_hashes_kept_as_sent(self):
        record = convert_event(stored([-1, 5], -2, PROMPT[:8]))
        assert (record.block_hashes, record.parent_block_hash) == ([-1, 5], -2)
        assert (record.token_ids, record.block_size) == (PROMPT[:8], BS)

    def test_root_has_no_parent(self):
        event = cpb.KvCacheEvent(
            stored=cpb.KvBlocksStored(
                blocks=[cpb.KvBlock(block_hash=1, token_ids=[1, 2], block_size=2)]
            )
        )
        assert convert_event(event).parent_block_hash is None

    def test_removed_and_cleared(self):
        removed = cpb.KvCacheEvent(removed=cpb.KvBlocksRemoved(block_hashes=[-5, 6]))
        assert convert_event(removed).block_hashes == [-5, 6]
        assert convert_event(cpb.KvCacheEvent(cleared=cpb.KvCacheCleared())) is CLEARED

    def test_empty_event_is_unknown(self):
        assert convert_event(cpb.KvCacheEvent(event_id=3)) is None

    @pytest.mark.parametrize(
        ("fields", "tier"),
        [
            ({"medium": "GPU"}, DEVICE),
            ({"medium": "CPU"}, OFFLOADED),
            ({"tier": cpb.KV_CACHE_TIER_HOST}, OFFLOADED),
            ({"tier": cpb.KV_CACHE_TIER_DEVICE}, DEVICE),
            ({"tier": cpb.KV_CACHE_TIER_EXTERNAL}, SKIP),
            ({"locality": cpb.KV_CACHE_LOCALITY_REMOTE}, SKIP),
        ],
    )
    def test_tier(self, fields, tier):
        record = convert_event(stored([1], None, PROMPT[:4], **fields))
        assert tier_of(record.medium, record.locality) == tier

    def test_removed_cache_level(self):
        event = cpb.KvCacheEvent(removed=cpb.KvBlocksRemoved(block_hashes=[1], cache_level=1))
        assert tier_of(convert_event(event).medium) == OFFLOADED

    def test_lora_salt_and_group(self):
        assert convert_event(stored([1], None, PROMPT[:4], lora_name="a")).lora_name == "a"
        assert convert_event(stored([1], None, PROMPT[:4], cache_salt="s")).extra_keys
        grouped = convert_event(
            stored([1], None, PROMPT[:4], group_idx=2, kv_cache_spec_kind="sliding_window")
        )
        assert (grouped.group_idx, grouped.kv_cache_spec_kind) == (2, "sliding_window")


class _Engine(sg_grpc.SglangSchedulerServicer):
    """Streams scripted batches per subscription, then ends the stream (or never does)."""

    def __init__(self) -> None:
        self.scripts: list[list[cpb.KvEventBatch]] = []
        self.requests: list[int] = []
        self.unimplemented = False

    async def SubscribeKvEvents(self, request, context):
        self.requests.append(request.start_sequence_number)
        if self.unimplemented:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no kv events")
        if request.start_sequence_number:  # as the stock servicers' relay answers
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, "resubscribe with zero")
        script = self.scripts.pop(0) if self.scripts else None
        if script is None:
            await asyncio.Event().wait()  # stay open until cancelled
        for item in script:
            if item is HOLD:
                await asyncio.Event().wait()
            if isinstance(item, grpc.StatusCode):
                await context.abort(item, "relay failure")
            yield item


@pytest.fixture
async def engine():
    servicer = _Engine()
    server = grpc.aio.server()
    sg_grpc.add_SglangSchedulerServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    servicer.target = f"127.0.0.1:{port}"
    yield servicer
    await server.stop(None)


@pytest.fixture
async def follow(engine):
    tasks = []

    def start(index: KvIndex, on_load=None) -> tuple[GrpcKvSource, asyncio.Task]:
        client = SglangClient(grpc.aio.insecure_channel(engine.target), IID)
        source = GrpcKvSource(
            IID, client, index, index.counters, on_load=on_load, sleep=lambda _: asyncio.sleep(0)
        )
        tasks.append(asyncio.create_task(source.run()))
        return source, tasks[-1]

    yield start
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class TestStream:
    async def test_batches_applied_and_every_subscription_starts_at_zero(self, engine, follow):
        """The stock relay refuses a non-zero start (OUT_OF_RANGE): a resubscription starts
        live from 0, from an empty view."""
        engine.scripts = [
            [
                batch(0, cpb.KvCacheEvent(cleared=cpb.KvCacheCleared())),
                batch(1, stored([10, 11], None, PROMPT[:8])),
                batch(1, load=cpb.EngineLoad(load_only=True, running_requests=2)),
            ],
            [batch(2, stored([20, 21, 22, 23], None, PROMPT)), HOLD],
        ]
        index = KvIndex()
        loads = []
        source, _ = follow(index, on_load=lambda rank, load: loads.append((rank, load)))
        await until(lambda: source.last_seq() == 2, "batch 2 of the second stream applied")
        assert index.overlaps(OWN) == {WORKER: 4}
        assert engine.requests[:2] == [0, 0]
        assert index.counters.batches_applied == 3
        assert [(r, load.running_requests) for r, load in loads] == [(0, 2)]

    async def test_data_loss_clears_and_resubscribes(self, engine, follow):
        engine.scripts = [
            [batch(0, stored([10, 11, 12, 13], None, PROMPT)), grpc.StatusCode.DATA_LOSS],
            [batch(0, stored([20], None, [7, 7, 7, 7])), HOLD],
        ]
        index = KvIndex()
        source, _ = follow(index)
        await until(lambda: index.counters.stream_restarts >= 1 and source.batches == 2, "again")
        assert index.overlaps(OWN) == {}
        assert index.overlaps(block_hashes([7, 7, 7, 7], BS)) == {WORKER: 1}

    async def test_reset_clears_worker(self, engine, follow):
        engine.scripts = [
            [
                batch(0, stored([10, 11, 12, 13], None, PROMPT)),
                batch(1),
                batch(0, stored([20], None, [7, 7, 7, 7])),
                HOLD,
            ],
        ]
        index = KvIndex()
        source, _ = follow(index)
        await until(lambda: index.counters.resets == 1, "reset seen")
        assert index.overlaps(OWN) == {}
        assert index.overlaps(block_hashes([7, 7, 7, 7], BS)) == {WORKER: 1}
        assert source.last_seq() == 0

    async def test_ranks_have_their_own_cursors(self, engine, follow):
        engine.scripts = [
            [
                batch(0, stored([10, 11, 12, 13], None, PROMPT), dp_rank=1),
                batch(0, stored([5], None, PROMPT[:4]), dp_rank=0),
                batch(1, dp_rank=1),
                HOLD,
            ]
        ]
        index = KvIndex()
        source, _ = follow(index)
        await until(lambda: source.last_seq(1) == 1, "rank 1 batch 1")
        assert index.overlaps(OWN) == {(IID, 0): 1, (IID, 1): 4}
        assert (index.counters.resets, index.counters.gaps) == (0, 0)

    async def test_gap_and_late_join_counted(self, engine, follow):
        engine.scripts = [[batch(5), batch(7), HOLD]]
        index = KvIndex()
        source, _ = follow(index)
        await until(lambda: source.last_seq() == 7, "batch 7 applied")
        assert (index.counters.late_joins, index.counters.gaps) == (1, 1)

    async def test_unimplemented_ends_the_source(self, engine, follow):
        engine.unimplemented = True
        index = KvIndex()
        source, task = follow(index)
        await until(task.done, "source ended")
        assert task.exception() is None
        assert engine.requests == [0]
        assert source.unimplemented
