"""The start-up heap, kept out of the garbage collector's full collections.

A full collection walks every tracked object. The imports, the app and the loaded tokenizers
are tens of thousands of objects that live as long as the process, so walking them is pure
pause: a full collection holds the event loop long enough for every stream to notice. Once
a service has started, collect once and freeze what is left (`gc.freeze`, as Instagram did
for its forked Django workers); after a late load of long-lived state (a tokenizer), freeze
again. Later collections skip the frozen, and the young generations, where request garbage
lives, are collected as before.

The youngest generation is collected every `YOUNG_THRESHOLD` net allocations instead of
CPython's 700. Nearly all request garbage is freed by reference counting; what a collection
finds is mostly the state of requests still in flight, which it walks and promotes (and the
next generation walks it again) without freeing anything, so at 700 the collections are a
visible share of the per-request CPU. Cyclic garbage waits longer to be freed: until that
many more objects were made than freed. The measurements: docs/benchmarks.md, "Garbage
collection".
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def settle(collect: bool = True) -> None:
    """Collect, then move every object still alive to the permanent generation, and collect
    the young generation less often from now on (YOUNG_THRESHOLD). Call it
    before the process reports its ports (a collection takes a while, and a client that
    read the report must find the port listening). Later, on a serving loop, pass
    `collect=False`: freezing alone is a constant-time list splice, and the garbage it
    freezes with the rest is that one moment's."""
    if collect:
        gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
