"""Smoke test of the overload benchmark: a tiny configuration runs end to end and writes its
table; under 3x load some requests are turned away with 429 and none fails. No timed
assertions."""

from __future__ import annotations

import json
from pathlib import Path

from test_bench_smoke import run_bench


def test_overload_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "overload.md"
    run_bench(
        "overload.py", "--levels", "1,3", "--seconds", "2", "--slots", "2", "--queue", "2",
        "--max-tokens", "8", "--out", str(out),
    )  # fmt: skip
    table = out.read_text()
    assert "| 1x |" in table and "| 3x |" in table
    results = json.loads(out.with_suffix(".json").read_text())
    assert results["capacity_req_s"] > 0
    one, three = results["levels"]
    for level in (one, three):
        assert level["failed"] == 0, level["first_failure"]
        assert level["retry_after_missing"] == 0
        assert level["goodput_req_s"] > 0 and level["ttft_p99_ms"] > 0
        assert level["preprocessor_peak_mib"] > 0 and level["stack_rss_peak_mib"] > 0
    assert three["rate_429"] > 0
