# The C extension's interface (services/router/kv/_index.c), for mypy.
from collections.abc import Sequence

def store_new(
    own_of: dict[int | bytes, int],
    masks: dict[int, int],
    engine_hashes: Sequence[int | bytes],
    owns: Sequence[int],
    bit: int,
    /,
) -> int: ...
def remove_plain(
    own_of: dict[int | bytes, int],
    masks: dict[int, int],
    engine_hashes: Sequence[int | bytes],
    keep: int,
    /,
) -> None: ...
