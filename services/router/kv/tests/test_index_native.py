"""The index's dict operations in C (services/router/kv/_index.c) against their Python form
in index.py: the same result and the same dicts, insertion order included."""

import random

import pytest

from switchyard.router.kv import index

try:
    from switchyard.router.kv import _index as native
except ImportError:  # pragma: no cover - installed without a C compiler
    native = None

pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built")


def worker_state(rng: random.Random, bit: int, others: int = 0b110):
    """(own_of, masks) of a worker holding 50 blocks, some of them held by others too."""
    own_of, masks = {}, {}
    for i in range(50):
        engine = rng.choice([i, 2**63 + i, bytes([i + 1]) * 4])
        own = rng.getrandbits(64)
        own_of[engine] = own
        masks[own] = bit | (others if rng.random() < 0.5 else 0)
    for _ in range(20):  # blocks of other workers only
        masks[rng.getrandbits(64)] = others
    return own_of, masks


def both(fn_name, *args):
    """(result, dicts) of the C and the Python form, each on its own copies of the dicts."""
    out = []
    for fn in (getattr(native, fn_name.lstrip("_")), getattr(index, fn_name)):
        own_of, masks = dict(args[0]), dict(args[1])
        result = fn(own_of, masks, *args[2:])
        out.append((result, list(own_of.items()), list(masks.items())))
    return out


class TestStoreNew:
    @pytest.mark.parametrize("seed", range(30))
    def test_same_as_python(self, seed):
        rng = random.Random(seed)
        own_of, masks = worker_state(rng, bit=1)
        n = rng.randrange(0, 6)
        engine = [10**6 + i for i in range(n)]
        owns = [rng.getrandbits(64) for _ in range(n)]
        case = rng.random()
        if case < 0.3 and n:  # an engine hash the worker holds already
            engine[rng.randrange(n)] = rng.choice(list(own_of))
        elif case < 0.6 and n:  # content held already (by this worker or others)
            owns[rng.randrange(n)] = rng.choice(list(masks))
        shape = rng.choice([list, tuple])
        c, py = both("_store_new", own_of, masks, shape(engine), shape(owns), 1)
        assert c == py

    def test_outcomes(self):
        own_of, masks = {1: 100}, {100: 1, 200: 2}
        assert native.store_new(dict(own_of), dict(masks), [2], [300], 1) == index._DONE
        assert native.store_new(dict(own_of), dict(masks), [2], [200], 1) == index._ALIASES
        assert native.store_new(dict(own_of), dict(masks), [1], [300], 1) == index._KNOWN

    def test_lengths_must_match(self):
        with pytest.raises(ValueError):
            native.store_new({}, {}, [1, 2], [3], 1)


class TestRemovePlain:
    @pytest.mark.parametrize("seed", range(30))
    def test_same_as_python(self, seed):
        rng = random.Random(seed)
        bit = 1
        own_of, masks = worker_state(rng, bit)
        gone = rng.sample(list(own_of), rng.randrange(0, 10))
        gone += [rng.choice([7_777_777, b"unknown"])] * rng.randrange(0, 2)  # never stored
        rng.shuffle(gone)
        c, py = both("_remove_plain", own_of, masks, rng.choice([list, tuple])(gone), ~bit)
        assert c == py

    def test_a_router_hash_missing_from_masks_is_a_key_error(self):
        with pytest.raises(KeyError):
            native.remove_plain({1: 100}, {}, [1], ~1)
