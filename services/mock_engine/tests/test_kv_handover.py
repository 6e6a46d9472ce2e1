"""The handover board: offer, claim (waiting or not), confirm, put back, deadlines, close."""

from __future__ import annotations

import asyncio

import pytest

from switchyard.mock_engine.errors import HandoverMissing
from switchyard.mock_engine.kv_handover import (
    HandoverBoard,
    KvPayload,
    describe,
    request_key,
    room_key,
)

PAYLOAD = KvPayload((1, 2, 3), 9, (0,), "engine")
LONG = 60.0  # a deadline no test reaches


class Releases:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


class TestBoard:
    async def test_claim_confirm_counts_and_releases(self) -> None:
        board, release = HandoverBoard(), Releases()
        picked = board.offer(room_key(5), PAYLOAD, release=release, deadline_s=LONG)
        assert await board.claim(room_key(5)) == PAYLOAD
        assert release.count == 0 and not picked.done()
        board.confirm(room_key(5), "peer")
        assert await picked is True
        assert release.count == 1 and board.counters.handed_over == 1 and len(board) == 0

    async def test_claim_waits_for_a_later_offer(self) -> None:
        board = HandoverBoard()
        waiting = asyncio.ensure_future(board.claim(room_key(1), wait_s=LONG))
        await asyncio.sleep(0)
        assert not waiting.done()
        board.offer(room_key(1), PAYLOAD, release=Releases(), deadline_s=LONG)
        assert await waiting == PAYLOAD
        board.confirm(room_key(1), "peer")

    async def test_unknown_without_wait(self) -> None:
        with pytest.raises(HandoverMissing) as raised:
            await HandoverBoard().claim(request_key("nope"))
        assert raised.value.reason == "unknown" and "request=nope" in str(raised.value)

    async def test_timeout_with_wait(self) -> None:
        with pytest.raises(HandoverMissing) as raised:
            await HandoverBoard().claim(room_key(3), wait_s=0.01)
        assert raised.value.reason == "timeout" and "room=3" in str(raised.value)

    async def test_one_claim_at_a_time_and_put_back(self) -> None:
        board = HandoverBoard()
        board.offer(room_key(2), PAYLOAD, release=Releases(), deadline_s=LONG)
        await board.claim(room_key(2))
        second = asyncio.ensure_future(board.claim(room_key(2), wait_s=LONG))
        await asyncio.sleep(0)
        assert not second.done()
        board.unclaim(room_key(2))  # the first fetch failed: the second gets it
        assert await second == PAYLOAD
        board.confirm(room_key(2), "peer")
        assert board.counters.handed_over == 1

    async def test_deadline_expires_an_unclaimed_offer(self) -> None:
        board, release = HandoverBoard(), Releases()
        picked = board.offer(request_key("r"), PAYLOAD, release=release, deadline_s=0.01)
        assert await picked is False
        assert release.count == 1 and board.counters.expired == 1
        with pytest.raises(HandoverMissing) as raised:
            await board.claim(request_key("r"))
        assert raised.value.reason == "expired"

    async def test_deadline_during_a_claim_waits_for_its_outcome(self) -> None:
        board, release = HandoverBoard(), Releases()
        picked = board.offer(request_key("r"), PAYLOAD, release=release, deadline_s=0.01)
        await board.claim(request_key("r"))
        await asyncio.sleep(0.05)
        assert not picked.done() and release.count == 0
        board.unclaim(request_key("r"))
        assert await picked is False and release.count == 1 and board.counters.expired == 1

    async def test_withdraw_and_close_release(self) -> None:
        board, first, second = HandoverBoard(), Releases(), Releases()
        picked = board.offer(room_key(1), PAYLOAD, release=first, deadline_s=LONG)
        board.withdraw(room_key(1))
        assert await picked is False and first.count == 1 and board.counters.expired == 0
        picked = board.offer(room_key(2), PAYLOAD, release=second, deadline_s=LONG)
        board.close()
        assert await picked is False and second.count == 1 and len(board) == 0

    async def test_duplicate_offer_is_refused(self) -> None:
        board = HandoverBoard()
        board.offer(room_key(1), PAYLOAD, release=Releases(), deadline_s=LONG)
        with pytest.raises(ValueError):
            board.offer(room_key(1), PAYLOAD, release=Releases(), deadline_s=LONG)
        board.close()

    def test_describe(self) -> None:
        assert describe(room_key(7)) == "room=7"
        assert describe(request_key("a")) == "request=a"
