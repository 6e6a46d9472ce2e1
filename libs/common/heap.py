"""The start-up heap, kept out of the garbage collector's full collections.

A full collection walks every tracked object. The imports, the app and the loaded tokenizers
are tens of thousands of objects that live as long as the process, so walking them is pure
pause: in the preprocessor a full collection of its ~68k start-up objects held the event
loop for 60-280 ms, about once per 1200 requests under load (measured with gc callbacks,
issue 13), and every stream waited. Once a service has started, collect once and freeze
what is left (`gc.freeze`, as Instagram did for its forked Django workers); after a late load
of long-lived state (a tokenizer), freeze again. Later collections skip the frozen, and the
young generations, where request garbage lives, are collected as before.
"""

from __future__ import annotations

import gc


def settle(collect: bool = True) -> None:
    """Collect, then move every object still alive to the permanent generation. Call it
    before the process reports its ports (a collection holds it ~100 ms, and a client
    that read the report must find the port listening). Later, on a serving loop, pass
    `collect=False`: freezing alone is a constant-time list splice, and the garbage it
    freezes with the rest is that one moment's."""
    if collect:
        gc.collect()
    gc.freeze()
