import pytest

from switchyard.router.bookings import Bookings

A, B = (1, 0), (2, 1)


class TestBookings:
    def test_leading_blocks_booked_per_worker(self):
        bookings = Bookings(ttl=10)
        bookings.add(A, [1, 2, 3], now=0)
        bookings.add(B, [1, 2], now=0)
        assert bookings.overlaps([1, 2, 3, 4], now=1) == {A: 3, B: 2}
        assert bookings.overlaps([9, 1], now=1) == {}

    def test_expiry(self):
        bookings = Bookings(ttl=10)
        bookings.add(A, [1, 2], now=0)
        bookings.add(A, [1], now=5)  # re-booked: lives on
        assert bookings.overlaps([1, 2], now=10) == {A: 1}
        assert bookings.overlaps([1, 2], now=15) == {}
        assert bookings.size(A) == 0

    def test_drop_instance_and_slot_reuse(self):
        bookings = Bookings(ttl=10)
        bookings.add(A, [1, 2], now=0)
        bookings.drop_instance(1)
        bookings.add((3, 0), [1], now=0)
        assert bookings.overlaps([1, 2], now=1) == {(3, 0): 1}

    def test_cap_per_worker_drops_the_oldest(self):
        bookings = Bookings(ttl=10, max_blocks_per_worker=2)
        bookings.add(A, [1, 2, 3], now=0)
        assert bookings.size(A) == 2
        assert bookings.overlaps([2, 3], now=1) == {A: 2}

    def test_ttl_zero_books_nothing(self):
        bookings = Bookings(ttl=0)
        bookings.add(A, [1], now=0)
        assert bookings.overlaps([1], now=0) == {}

    def test_bad_config(self):
        with pytest.raises(ValueError):
            Bookings(ttl=-1)
