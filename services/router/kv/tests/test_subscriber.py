import asyncio
import contextlib

import pytest

from switchyard.common.block_hash import block_hashes
from switchyard.common.ports import free_port
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
            follow_ups=(),  # the tests below count the replays asked
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


@pytest.fixture
async def waiting(zctx):
    """A ZmqKvSource subscribed to free ports nobody binds yet (the publisher comes later)."""
    started: list[tuple[asyncio.Task, KvStream]] = []

    async def start() -> tuple[Harness, tuple[int, int]]:
        ports = (free_port(), free_port())
        index = KvIndex()
        stream = KvStream(
            WORKER,
            index,
            index.counters,
            zctx,
            replay_endpoint=f"tcp://127.0.0.1:{ports[1]}",
        )
        endpoint = f"tcp://127.0.0.1:{ports[0]}"
        task = asyncio.create_task(
            ZmqKvSource(stream, index.counters, zctx, endpoint=endpoint).run()
        )
        started.append((task, stream))
        return Harness(index, stream, task), ports

    yield start
    for task, stream in started:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await stream.close()


class TestReconnect:
    """Issue 32: the connection to a publisher is made again (it bound late, or restarted);
    what it published before the subscription reached it is caught up from its replay."""

    async def test_late_bind_burst_is_indexed(self, waiting, make_publisher):
        """Regression: a publisher that bound after the router subscribed and published one
        burst was never indexed (the catch-up had given up after 2 s of silence)."""
        h, ports = await waiting()
        await asyncio.sleep(0.6)  # the SUB retries meanwhile, backing off
        pub = make_publisher(ports=ports)
        for event in chain_events(PROMPT, BS, 100):
            await pub.publish([event])  # dropped by the PUB unless the SUB got there first
        await until(lambda: h.index.overlaps(OWN) == {WORKER: 8}, "the burst indexed")
        assert h.stream.stats.connected and h.stream.stats.last_seq == 3

    async def test_restart_with_fewer_batches_rebuilds(self, waiting, make_publisher):
        h, ports = await waiting()
        pub = make_publisher(ports=ports)
        await pub.wait_subscribed()
        for event in chain_events(PROMPT, BS, 100):
            await pub.publish([event])
        await h.applied(3)
        await pub.close()
        pub = make_publisher(ports=ports)  # restarted: numbering from 0 again
        await pub.publish([cleared_array()] + chain_events(OTHER, BS, 900, per=4))
        await until(lambda: h.index.overlaps(OTHER_OWN) == {WORKER: 4}, "the new life indexed")
        assert h.index.overlaps(OWN) == {}
        assert h.index.counters.publisher_restarts == 1
        assert h.stream.stats.resets == 1

    async def test_restart_with_more_batches_told_by_payload(self, waiting, make_publisher):
        """The restarted publisher holds a batch at the last applied sequence too: its
        payload differs from the one applied, so it is a restart, not a resumption."""
        h, ports = await waiting()
        pub = make_publisher(ports=ports)
        await pub.wait_subscribed()
        await pub.publish(chain_events(PROMPT, BS, 100, per=8))
        await h.applied(0)
        await pub.close()
        pub = make_publisher(ports=ports)
        events = chain_events(OTHER, BS, 900, per=1)
        for event in events[:2]:
            await pub.publish([event], send=False)  # published before the restart's reconnect
        await h.stream.caught_up.wait()
        await until(lambda: len(pub.replay_requests) >= 2, "the catch-up after the restart")
        assert pub.replay_requests[:2] == [0, 0]  # from the last applied seq, then from 0
        for event in events[2:]:
            await pub.publish([event])
        await until(lambda: h.index.overlaps(OTHER_OWN) == {WORKER: 4}, "rebuilt")
        assert h.index.overlaps(OWN) == {}

    async def test_same_publisher_resumes_from_the_last_sequence(self, waiting, make_publisher):
        h, ports = await waiting()
        pub = make_publisher(ports=ports)
        await pub.wait_subscribed()
        events = chain_events(PROMPT, BS, 100)
        await pub.publish([events[0]])
        await h.applied(0)
        await pub.publish([events[1]], send=False)
        h.stream.reconnected()  # as the monitor reports a connection made again
        await h.applied(1)
        assert pub.replay_requests.count(0) >= 2  # at the first connection; then from seq 0
        assert h.index.counters.publisher_restarts == 0
        assert h.index.overlaps(OWN) == {WORKER: 4}


class TestAdmission:
    async def test_stores_stamped_before_admission_are_not_claimed(self, zctx):
        """Issue 32: real vLLM warms up, resets its prefix cache, and publishes that
        AllBlocksCleared only at its next step: the warm-up's stores, stamped before fleet
        admitted the engine, must not be claimed meanwhile."""
        index = KvIndex()
        stream = KvStream(WORKER, index, index.counters, zctx, not_before=100.0)
        stream.start()
        stream.feed(0, payload(chain_events(PROMPT, BS, 100, per=8), ts=99.0))  # warm-up
        assert index.overlaps(OWN) == {}
        assert index.counters.pre_admission_stores == 1
        stream.feed(1, payload(chain_events(OTHER, BS, 900, per=4), ts=101.0))
        assert index.overlaps(OTHER_OWN) == {WORKER: 4}
        assert stream.stats.last_seq == 1 and stream.stats.batch_ts == 101.0
        await stream.close()


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
