import pytest

from switchyard.router.bookings import Bookings
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.types import Stored

A, B = (1, 0), (2, 1)


def bookings(ttl=10.0, **kw):
    return Bookings(KvIndex(), ttl, **kw)


class TestBookings:
    def test_leading_blocks_booked_per_worker(self):
        b = bookings()
        b.add(A, [1, 2, 3], now=0)
        b.add(B, [1, 2], now=0)
        assert b.overlaps([1, 2, 3, 4], now=1) == {A: 3, B: 2}
        assert b.overlaps([9, 1], now=1) == {}

    def test_held_blocks_and_bookings_walk_together(self):
        b = bookings()
        tokens = list(range(8))
        b.index.apply_batch(A, [Stored([100], None, tokens[:4], 4)])
        from switchyard.common.block_hash import block_hashes

        hashes = block_hashes(tokens, 4)
        b.add(A, hashes, now=0, start=1)  # the first block is held: only the second booked
        assert b.size(A) == 1
        assert b.overlaps(hashes, now=1) == {A: 2}

    def test_expiry(self):
        b = bookings()
        b.add(A, [1, 2], now=0)
        b.add(A, [1], now=5)  # re-booked: lives on
        assert b.overlaps([1, 2], now=10) == {A: 1}
        assert b.overlaps([1, 2], now=15) == {}
        assert b.size(A) == 0

    def test_drop_instance(self):
        b = bookings()
        b.add(A, [1, 2], now=0)
        b.drop_instance(1)
        b.add((3, 0), [1], now=0)
        assert b.overlaps([1, 2], now=1) == {(3, 0): 1}

    def test_cap_per_worker_drops_the_oldest(self):
        b = bookings(max_blocks_per_worker=2)
        b.add(A, [1, 2, 3], now=0)
        assert b.size(A) == 2

    def test_ttl_zero_books_nothing(self):
        b = bookings(ttl=0)
        b.add(A, [1], now=0)
        assert b.overlaps([1], now=0) == {}

    def test_bad_config(self):
        with pytest.raises(ValueError):
            bookings(ttl=-1)
