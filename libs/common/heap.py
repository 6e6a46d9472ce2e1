"""The start-up heap, kept out of the garbage collector's full collections.

A full collection walks every tracked object. The imports, the app and the loaded tokenizers
are tens of thousands of objects that live as long as the process, so walking them is pure
pause: in the preprocessor a full collection of its ~68k start-up objects held the event
loop for 60-280 ms, about once per 1200 requests under load (measured with gc callbacks,
issue 13), and every stream waited. Once a service has started, collect once and freeze
what is left (`gc.freeze`, as Instagram did for its forked Django workers); after a late load
of long-lived state (a tokenizer), freeze again. Later collections skip the frozen, and the
young generations, where request garbage lives, are collected as before.

The youngest generation is collected every `YOUNG_THRESHOLD` net allocations instead of
CPython's 700. Nearly all request garbage is freed by reference counting; what a collection
finds is mostly the state of requests still in flight, which it walks and promotes (and the
next generation walks it again) without freeing anything. At 700, collections cost the
preprocessor ~75 us per streamed request and ~40 us per whole one at concurrency 128 (~6% of
its CPU; 350-400 young collections per 5000 requests), the dispatcher ~14 us; at 10 000 there
were 4-5 per 5000 requests, each pausing the loop ~4 ms, no longer than the middle-generation
collections they replace (measured with gc callbacks, bench/hotspots.py, issue 13). Cyclic
garbage waits longer to be freed: until that many more objects were made than freed.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def settle(collect: bool = True) -> None:
    """Collect, then move every object still alive to the permanent generation, and collect
    the young generation less often from now on (YOUNG_THRESHOLD). Call it
    before the process reports its ports (a collection holds it ~100 ms, and a client
    that read the report must find the port listening). Later, on a serving loop, pass
    `collect=False`: freezing alone is a constant-time list splice, and the garbage it
    freezes with the rest is that one moment's."""
    if collect:
        gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
