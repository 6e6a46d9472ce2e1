import pytest

from switchyard.router.predicted import PredictedPrefixes


class TestPredictedPrefixes:
    def test_leading_blocks_per_worker(self):
        p = PredictedPrefixes(ttl=10)
        p.add(1, [10, 11, 12], now=0)
        p.add(2, [10, 99], now=0)
        assert p.overlaps([10, 11, 12, 13], [1, 2, 3], now=1) == {1: 3, 2: 1}

    def test_entries_expire(self):
        p = PredictedPrefixes(ttl=5)
        p.add(1, [10, 11], now=0)
        p.add(1, [10, 11, 12], now=4)  # refreshes 10 and 11
        assert p.overlaps([10, 11, 12], [1], now=6) == {1: 3}
        assert p.overlaps([10, 11, 12], [1], now=9) == {}
        assert p.size(1) == 0

    def test_capacity_drops_the_oldest(self):
        p = PredictedPrefixes(ttl=10, max_blocks_per_worker=3)
        p.add(1, [1, 2, 3, 4], now=0)
        assert p.size(1) == 3
        assert p.overlaps([1, 2], [1], now=0) == {}
        assert p.overlaps([2, 3, 4], [1], now=0) == {1: 3}

    def test_drop_instance_and_zero_ttl(self):
        p = PredictedPrefixes(ttl=10)
        p.add(1, [1], now=0)
        p.drop_instance(1)
        assert p.overlaps([1], [1], now=0) == {}
        off = PredictedPrefixes(ttl=0)
        off.add(1, [1], now=0)
        assert off.overlaps([1], [1], now=0) == {}
        with pytest.raises(ValueError):
            PredictedPrefixes(ttl=-1)
