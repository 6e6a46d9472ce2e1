"""Which of Switchyard's C extensions the processes use.

Each extension (the block hash, the KV index's dict operations, the engine streams' frame
reader, LoopSocket's ZMQ_EVENTS read) has a pure-Python form of identical output, used when
the extension is not built (an install without a C compiler) or when `SWITCHYARD_NATIVE=0`
is set: a way to run any process, and the test suite (`make test-pure`), on the Python
forms alone.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

ENV = "SWITCHYARD_NATIVE"
ENABLED = os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def load(name: str) -> ModuleType | None:
    """The extension module `name`, or None when it is not built or turned off."""
    if not ENABLED:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
