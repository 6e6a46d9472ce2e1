"""Smoke test of bench/hops.py: its tiny configuration runs every section end to end and
reports every variant against its baseline. No timed assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_bench_smoke import ROOT, run_bench


def test_hops_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run_bench("hops.py", "--quick", "--out-dir", str(out))

    text = (out / "hops.md").read_text()
    for section in ("grpc", "zmq", "route", "stack"):
        assert f"## {section}" in text, section
    comparisons = json.loads((out / "hops.json").read_text())
    points = {(c["section"], c["point"]) for c in comparisons}
    assert points == {
        ("grpc", "c=4 tokens=16"),
        ("zmq", "ping c=4"),
        ("zmq", "stream c=4 replies=16"),
        ("route", "c=4"),
        ("stack", "c=4 tokens=16"),
    }
    for c in comparisons:
        where = (c["section"], c["point"])
        assert c["pairs"], where
        first = c["metrics"][0]
        for variant, pairs in c["pairs"].items():
            assert variant != c["baseline"], where
            for base, other in pairs:
                assert base[first] > 0 and other[first] > 0, (where, variant)
                assert set(base) == set(c["metrics"]) == set(other), (where, variant)
        assert f"| {c['baseline']} |" in text, where


def test_hops_refuses_a_baseline_alone() -> None:
    # The first variant is the baseline: alone, no pair runs and there is nothing to report.
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "hops.py"), "zmq", "--variants", "tcp-loop-1"],
        cwd=ROOT / "bench", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "at least one variant to run beside it" in result.stderr
    assert "Traceback" not in result.stderr
