import asyncio
import contextlib

import pytest

from switchyard.common.block_hash import block_hashes
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.stream import KvStream
from switchyard.router.kv.subscriber import ZmqKvSource, rank_endpoint, resolve_endpoint
from switchyard.router.kv.tests.wire import (
    chain_events,
    cleared_array,
    payload,
    seq_bytes,
    until,
)

BS = 4
PROMPT = list(range(1, 33))  # 8 blocks
OWN = block_hashes(PROMPT, BS)
OTHER = list(range(500, 516))  # 4 blocks
OTHER_OWN = block_hashes(OTHER, BS)
WORKER = (7, 0)


class Harness:
    def __init__(self, index: KvIndex, stream: KvStream, task: asyncio.Task) -> None:
        self.index, self.stream, self.task = index, stream, task

    async def applied(self, seq: int) -> None:
        await until(lambda: self.stream.last_seq == seq, f"batch {seq} applied")


@pytest.fixture
async def follow(zctx):
    """Start a ZmqKvSource on a publisher; cancel it at teardown (its sockets close)."""
    started: list[tuple[asyncio.Task, KvStream]] = []

    async def start(publisher, *, replay=True, replay_timeout=2.0, index=None) -> Harness:
        index = index or KvIndex()
        stream = KvStream(
            WORKER,
            index,
            index.counters,
            zctx,
            replay_endpoint=publisher.replay_endpoint if replay else None,
            replay_timeout=replay_timeout,
        )
        source = ZmqKvSource(stream, index.counters, zctx, endpoint=publisher.endpoint)
        task = asyncio.create_task(source.run())
        started.append((task, stream))
        await publisher.wait_subscribed()
        await asyncio.wait_for(stream.caught_up.wait(), replay_timeout + 5)
        return Harness(index, stream, task)

    yield start
    for task, stream in started:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await stream.close()


class TestInOrder:
    async def test_batches_applied(self, make_publisher, follow):
        pub = make_publisher()
        h = await follow(pub)
        for event in chain_events(PROMPT, BS, 100):
            await pub.publish([event])
        await h.applied(3)
        assert h.index.overlaps(OWN) == {WORKER: 8}
        assert h.index.counters.replays == 0
        assert h.index.counters.batches_applied == 4
        assert pub.replay_requests == [0]  # the catch-up at start

    async def test_topic_is_ignored(self, make_publisher, follow):
        pub = make_publisher(topic=b"kv-events")
        h = await follow(pub)
        await pub.publish(chain_events(PROMPT, BS, 100))
        await h.applied(0)
        assert h.index.overlaps(OWN) == {WORKER: 8}


class TestGap:
    @pytest.mark.parametrize("four_frames", [False, True])
    async def test_gap_replayed_and_index_complete(self, make_publisher, follow, four_frames):
        pub = make_publisher()
        pub.four_frames = four_frames
        h = await follow(pub)
        events = chain_events(PROMPT, BS, 100)  # 4 events, each chained to the previous
        await pub.publish([events[0]])
        await pub.publish([events[1]], send=False)
        await pub.publish([events[2]], send=False)
        await pub.publish([events[3]])
        await h.applied(3)
        assert h.index.overlaps(OWN) == {WORKER: 8}
        counters = h.index.counters
        assert (counters.gaps, counters.replays, counters.replayed_batches) == (1, 1, 2)
        assert counters.unknown_parent == 0
        assert pub.replay_requests == [0, 1]  # catch-up, then the gap

    async def test_gap_without_replay_endpoint_goes_on(self, make_publisher, follow):
        pub = make_publisher()
        h = await follow(pub, replay=False)
        events = chain_events(PROMPT, BS, 100)
        await pub.publish([events[0]])
        await pub.publish([events[1]], send=False)
        await pub.publish([events[2]])
        await h.applied(2)
        counters = h.index.counters
        assert (counters.gaps, counters.replay_failures) == (1, 1)
        assert counters.unknown_parent == 1  # the batch after the gap lacks its parent
        assert h.index.overlaps(OWN) == {WORKER: 2}

    async def test_replay_timeout_goes_on(self, make_publisher, follow):
        pub = make_publisher()
        pub.replay_silent = True
        h = await follow(pub, replay_timeout=0.2)
        events = chain_events(PROMPT, BS, 100)
        await pub.publish([events[0]])
        await pub.publish([events[1]], send=False)
        await pub.publish([events[2]])
        await h.applied(2)
        assert h.index.counters.replay_failures == 1
        await pub.publish([events[3]])  # the source still follows the stream
        await h.applied(3)

    async def test_replay_buffer_too_short(self, make_publisher, follow):
        pub = make_publisher()
        h = await follow(pub)
        events = chain_events(PROMPT, BS, 100)
        await pub.publish([events[0]])
        await pub.publish([events[1]], send=False)
        pub.buffer.pop()  # the engine's buffer no longer holds batch 1
        await pub.publish([events[2]])
        await h.applied(2)
        assert h.index.counters.replay_incomplete == 1
        assert h.index.overlaps(OWN) == {WORKER: 2}


class TestReset:
    async def test_restart_clears_the_worker(self, make_publisher, follow):
        pub = make_publisher()
        h = await follow(pub)
        for event in chain_events(PROMPT, BS, 100):
            await pub.publish([event])
        await h.applied(3)
        pub.restart()
        await pub.publish([cleared_array()] + chain_events(OTHER, BS, 900, per=4))
        await h.applied(0)
        assert h.index.overlaps(OWN) == {}
        assert h.index.overlaps(OTHER_OWN) == {WORKER: 4}
        assert h.index.counters.resets == 1

    async def test_restart_without_cleared_event_still_clears(self, make_publisher, follow):
        """vLLM sends no AllBlocksCleared at start: the reset itself must clear."""
        pub = make_publisher()
        h = await follow(pub)
        await pub.publish(chain_events(PROMPT, BS, 100, per=8))
        await pub.publish([])
        await h.applied(1)
        pub.restart()
        await pub.publish(chain_events(OTHER, BS, 900, per=4))
        await h.applied(0)
        assert h.index.overlaps(OWN) == {}
        assert h.index.overlaps(OTHER_OWN) == {WORKER: 4}

    async def test_restart_first_batches_missed_are_replayed(self, make_publisher, follow):
        pub = make_publisher()
        h = await follow(pub)
        for event in chain_events(PROMPT, BS, 100):
            await pub.publish([event])
        await h.applied(3)
        pub.restart()
        other = chain_events(OTHER, BS, 900)
        await pub.publish([cleared_array(), other[0]], send=False)
        await pub.publish([other[1]])
        await h.applied(1)
        assert h.index.overlaps(OWN) == {}
        assert h.index.overlaps(OTHER_OWN) == {WORKER: 4}
        assert pub.replay_requests == [0, 0]  # catch-up, then the reset
        assert h.index.counters.resets == 1


class TestLateJoin:
    async def test_first_message_after_seq_0_replays_from_0(self, make_publisher, follow):
        pub = make_publisher()
        events = chain_events(PROMPT, BS, 100)
        await pub.publish([cleared_array()], send=False)  # before we subscribed
        for event in events[:3]:
            await pub.publish([event], send=False)
        h = await follow(pub)
        await pub.publish([events[3]])
        await h.applied(4)
        assert h.index.overlaps(OWN) == {WORKER: 8}
        assert h.index.counters.replayed_batches >= 1  # joined late: caught up
        assert pub.replay_requests == [0]

    async def test_idle_engine_is_caught_up_without_a_live_batch(self, make_publisher, follow):
        """Regression: a router (re)started next to an idle engine used to wait for the
        engine's next batch before replaying, leaving the index empty meanwhile."""
        pub = make_publisher()
        for event in chain_events(PROMPT, BS, 100)[:4]:
            await pub.publish([event], send=False)  # all before we subscribed; none after
        h = await follow(pub)
        await h.applied(3)
        assert h.index.overlaps(OWN) == {WORKER: 8}


class TestBadMessages:
    async def test_undecodable_payload_counted_and_sequence_kept(self, make_publisher, follow):
        pub = make_publisher()
        h = await follow(pub)
        await pub.publish([])
        await pub.send_raw([b"", seq_bytes(1), b"\xc1"])
        pub.next_seq = 2
        await pub.send_raw([b"", b"short", payload([])])
        await pub.publish(chain_events(PROMPT, BS, 100, per=8))
        await h.applied(2)
        counters = h.index.counters
        assert counters.decode_errors == 2
        assert counters.gaps == 0
        assert h.index.overlaps(OWN) == {WORKER: 8}


class TestResolveEndpoint:
    @pytest.mark.parametrize(
        ("endpoint", "host", "expected"),
        [
            ("tcp://*:5557", "10.0.0.5", "tcp://10.0.0.5:5557"),
            ("tcp://0.0.0.0:5557", "engine-a", "tcp://engine-a:5557"),
            ("tcp://[::]:5557", "::1", "tcp://[::1]:5557"),
            ("tcp://10.0.0.9:5557", "10.0.0.5", "tcp://10.0.0.9:5557"),
            ("tcp://*:5557", None, "tcp://*:5557"),
            ("ipc:///tmp/kv", "h", "ipc:///tmp/kv"),
        ],
    )
    def test_wildcards_replaced_by_engine_host(self, endpoint, host, expected):
        assert resolve_endpoint(endpoint, host) == expected


class TestRankEndpoint:
    @pytest.mark.parametrize(
        ("endpoint", "rank", "expected"),
        [
            ("tcp://h:5557", 0, "tcp://h:5557"),
            ("tcp://h:5557", 3, "tcp://h:5560"),
            ("tcp://[::1]:5557", 1, "tcp://[::1]:5558"),
            ("inproc://kv", 2, "inproc://kv_dp2"),
            ("ipc:///tmp/kv", 1, "ipc:///tmp/kv"),
        ],
    )
    def test_base_port_plus_rank(self, endpoint, rank, expected):
        """Both engines' offset_endpoint_port: rank r publishes on base port + r."""
        assert rank_endpoint(endpoint, rank) == expected
