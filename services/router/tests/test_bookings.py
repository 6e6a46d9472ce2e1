import pytest

from switchyard.router.bookings import Bookings, common_prefix, pack

A, B = (1, 0), (2, 1)


class TestBookings:
    def test_leading_blocks_booked_per_worker(self):
        b = Bookings()
        b.add(A, [1, 2, 3], now=0)
        b.add(B, [1, 2], now=0)
        assert b.overlaps([1, 2, 3, 4], now=1) == {A: 3, B: 2}
        assert b.overlaps([1, 5], now=1) == {A: 1, B: 1}
        assert b.overlaps([9, 1], now=1) == {}

    def test_the_longest_of_a_workers_bookings_counts(self):
        b = Bookings()
        b.add(A, [1, 2, 3, 4], now=0)
        b.add(A, [1, 2, 7], now=0)
        assert b.overlaps([1, 2, 3, 9], now=1) == {A: 3}
        assert b.overlaps([1, 2, 7, 9], now=1) == {A: 3}

    def test_a_next_turn_replaces_the_turn_it_extends(self):
        b = Bookings()
        b.add(A, [1, 2], now=0)
        b.add(A, [1, 2, 3], now=1)
        assert b.size(A) == 1
        assert b.overlaps([1, 2, 3], now=2) == {A: 3}

    def test_expiry(self):
        b = Bookings(ttl=10)
        b.add(A, [1, 2], now=0)
        b.add(A, [1, 3], now=5)
        assert b.overlaps([1, 2], now=10) == {A: 1}  # the first one expired
        assert b.overlaps([1, 2], now=15) == {}
        assert b.size(A) == 0 and not b

    def test_per_worker_cap(self):
        b = Bookings(per_worker=2)
        for tail in (5, 6, 7):
            b.add(A, [1, tail], now=0)
        assert b.size(A) == 2
        assert b.overlaps([1, 5], now=1) == {A: 1}

    def test_drop_instance(self):
        b = Bookings()
        b.add(A, [1, 2], now=0)
        b.add(B, [1, 2], now=0)
        b.drop_instance(1)
        assert b.overlaps([1, 2], now=1) == {B: 2}

    def test_ttl_zero_books_nothing(self):
        b = Bookings(ttl=0)
        b.add(A, [1], now=0)
        assert b.overlaps([1], now=0) == {}

    def test_bad_config(self):
        with pytest.raises(ValueError):
            Bookings(ttl=-1)


def test_common_prefix():
    assert common_prefix(pack([1, 2, 3]), pack([1, 2, 4])) == 2
    assert common_prefix(pack([1, 2]), pack([1, 2, 3])) == 2
    assert common_prefix(pack([]), pack([1])) == 0
    assert common_prefix(pack([5]), pack([1])) == 0
    assert common_prefix(pack([2**64 - 1, 7]), pack([2**64 - 1, 7])) == 2


def test_overlaps_are_the_longest_common_prefix_of_what_is_filed():
    """The lookup's shortcut (a booking that parts at the second block) gives the depths the
    full search gives, for depths 0, 1 and more, and for one-block prompts."""
    import random

    rng = random.Random(3)
    b = Bookings(per_worker=3)
    for _ in range(300):
        hashes = [1] + [rng.choice((2, 3)) for _ in range(rng.randrange(0, 4))]
        if rng.random() < 0.5:
            b.add(rng.choice((A, B)), hashes, now=0)
        else:
            expected = {
                worker: max(common_prefix(pack(hashes), booked) for booked, _ in filed)
                for worker, filed in b._filed.get((1, 8), {}).items()
            }
            assert b.overlaps(hashes, now=1) == expected


class TestBookedTokenBytes:
    """The core books a prompt's token bytes (no hash beyond the first): lookups must read
    as the hash-based ones do."""

    def test_same_depths_as_booked_hashes(self):
        from array import array

        from switchyard.common.block_hash import block_hashes

        size = 4
        base = list(range(100, 132))  # 8 blocks

        def data(tokens):
            return array("I", tokens[: len(tokens) // size * size]).tobytes()

        prompts = {A: base, B: base[:12] + [7] * 8}
        by_hash, by_bytes = Bookings(), Bookings()
        for worker, tokens in prompts.items():
            hashes = block_hashes(tokens, size)
            by_hash.add(worker, hashes, now=0)
            by_bytes.add_blocks(worker, hashes[0], data(tokens), size * 4, now=0)
        for probe in (base, base[:20] + [9] * 12, base[:12] + [7] * 8 + [1] * 4, [5] * 8):
            hashes = block_hashes(probe, size)
            expected = by_hash.overlaps(hashes, now=1)
            got = by_bytes.overlaps_blocks(hashes[0], data(probe), size * 4, now=1)
            assert got == expected
        assert by_bytes.overlaps_blocks(1, b"x" * 16, 16, now=11) == {} and not by_bytes
