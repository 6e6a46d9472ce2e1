"""What the docs say, for the tests that hold them to the code (test_docs, test_operability)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OPERATING = DOCS / "operating.md"

_METRIC = re.compile(r"\b(?:switchyard|process)_[a-z0-9_]+")


def documented_metrics() -> set[str]:
    """Every full metric name docs/operating.md mentions."""
    return set(_METRIC.findall(OPERATING.read_text()))


def undocumented_metrics(families: set[str]) -> list[str]:
    """The metric families (as prometheus_client names them: a counter without `_total`)
    that docs/operating.md does not name in full."""
    named = documented_metrics()
    # prometheus_client's classic exposition adds a `<counter>_created` gauge per counter
    own = {f for f in families if not (f.endswith("_created") and f[:-8] in families)}
    return sorted(f for f in own if f not in named and f + "_total" not in named)


def metrics_message(missing: list[str], where: str) -> str:
    return (
        f"metrics exported by {where} but not named in docs/operating.md: {missing}. Add a "
        "row for each to the metrics table in docs/operating.md (its full name, counters "
        "with _total; its labels; what it counts)."
    )
