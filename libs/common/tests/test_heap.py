"""The settled heap: garbage is collected first, what lives on leaves the generations."""

import gc
import weakref

from switchyard.common.heap import YOUNG_THRESHOLD, settle


class _Node:
    pass


class TestSettle:
    def test_garbage_collected_and_the_living_frozen(self):
        gc.unfreeze()
        try:
            node = _Node()
            node.me = node  # a cycle: only a collection frees it
            dead = weakref.ref(node)
            del node
            kept = [_Node() for _ in range(1000)]
            settle()
            assert dead() is None  # collected, not frozen with the rest
            assert gc.get_freeze_count() >= len(kept)
            assert gc.get_count()[2] == 0  # nothing left in the oldest generation
        finally:
            gc.unfreeze()

    def test_freeze_alone_leaves_collecting_to_later(self):
        gc.unfreeze()
        try:
            gc.collect()
            node = _Node()
            node.me = node
            dead = weakref.ref(node)
            del node
            settle(collect=False)
            assert dead() is not None  # frozen with the rest: one moment's garbage
            assert gc.get_freeze_count() > 0
        finally:
            gc.unfreeze()
            gc.collect()

    def test_the_young_generation_is_collected_less_often(self):
        before = gc.get_threshold()
        try:
            gc.set_threshold(700, 10, 10)
            settle(collect=False)
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
            assert YOUNG_THRESHOLD > 700
        finally:
            gc.set_threshold(*before)
            gc.unfreeze()
