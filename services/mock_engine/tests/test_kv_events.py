"""The publisher: one batch per loop iteration, sequence numbers, replay buffer, subscriptions."""

from __future__ import annotations

import asyncio

import pytest

from switchyard.mock_engine.errors import KvHistoryTruncated
from switchyard.mock_engine.kv_events import KvEventPublisher
from switchyard.mock_engine.types import AllBlocksCleared, BlockRemoved, EventBatch


def make_publisher(buffer_steps: int = 100) -> tuple[KvEventPublisher, list[tuple[int, bytes]]]:
    sent: list[tuple[int, bytes]] = []
    publisher = KvEventPublisher(
        encode=lambda batch: f"{batch.seq}:{len(batch.events)}".encode(),
        buffer_steps=buffer_steps,
        wall_clock=lambda: 42.0,
    )
    publisher.add_listener(lambda seq, payload: sent.append((seq, payload)))
    return publisher, sent


def removed(h: int) -> BlockRemoved:
    return BlockRemoved((h,))


class TestBatching:
    async def test_one_batch_per_loop_iteration(self) -> None:
        publisher, sent = make_publisher()
        publisher.emit([removed(1)])
        publisher.emit([removed(2), removed(3)])
        assert sent == []  # closed at the end of the iteration
        await asyncio.sleep(0)
        assert sent == [(0, b"0:3")]
        publisher.emit([removed(4)])
        await asyncio.sleep(0)
        assert sent == [(0, b"0:3"), (1, b"1:1")]
        assert publisher.buffered()[0] == EventBatch(0, 42.0, (removed(1), removed(2), removed(3)))

    async def test_nothing_emitted_nothing_sent(self) -> None:
        publisher, sent = make_publisher()
        publisher.emit([])
        await asyncio.sleep(0)
        assert sent == [] and publisher.next_seq == 0

    async def test_publish_now_follows_the_pending_step(self) -> None:
        publisher, sent = make_publisher()
        publisher.emit([removed(1)])
        publisher.publish_now([AllBlocksCleared()])
        assert [seq for seq, _ in sent] == [0, 1]
        assert publisher.buffered()[1].events == (AllBlocksCleared(),)

    async def test_broken_listener_does_not_stop_publishing(self) -> None:
        publisher, sent = make_publisher()

        def broken(seq: int, payload: bytes) -> None:
            raise RuntimeError("transport down")

        publisher.add_listener(broken)
        publisher.publish_now([removed(1)])
        assert sent == [(0, b"0:1")]


class TestReplayBuffer:
    def test_replay_from_the_middle(self) -> None:
        publisher, _ = make_publisher()
        for h in range(5):
            publisher.publish_now([removed(h)])
        assert [seq for seq, _ in publisher.replay(3)] == [3, 4]
        assert publisher.replay(9) == []

    def test_buffer_keeps_the_last_n(self) -> None:
        publisher, _ = make_publisher(buffer_steps=3)
        for h in range(5):
            publisher.publish_now([removed(h)])
        assert [seq for seq, _ in publisher.replay(0)] == [2, 3, 4]


class TestSubscriptions:
    async def test_start_zero_is_live_only(self) -> None:
        publisher, _ = make_publisher()
        publisher.publish_now([removed(0)])
        subscription = publisher.subscribe(0)
        publisher.publish_now([removed(1)])
        publisher.close()
        assert [batch.seq async for batch in subscription] == [1]
        assert publisher.subscriber_count == 0

    async def test_resume_replays_then_goes_live(self) -> None:
        publisher, _ = make_publisher()
        for h in range(4):
            publisher.publish_now([removed(h)])
        subscription = publisher.subscribe(2)
        publisher.publish_now([removed(4)])
        publisher.close()
        assert [batch.seq async for batch in subscription] == [2, 3, 4]

    async def test_resume_before_the_buffer_is_refused(self) -> None:
        publisher, _ = make_publisher(buffer_steps=2)
        for h in range(4):
            publisher.publish_now([removed(h)])
        with pytest.raises(KvHistoryTruncated) as raised:
            publisher.subscribe(1)
        assert (raised.value.start, raised.value.oldest) == (1, 2)

    async def test_subscribe_after_close_ends_at_once(self) -> None:
        publisher, _ = make_publisher()
        publisher.close()
        assert [batch async for batch in publisher.subscribe(0)] == []
