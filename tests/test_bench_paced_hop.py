"""Smoke test of bench/paced_hop.py: a few messages through every relay variant, in both
output forms, and its refusal of an unknown variant. No timed assertions: the numbers are
only checked to be there and to be measurements: CPU positive, wake-ups finite and not
negative (a relay that never sleeps between messages, on a loaded machine, wakes 0 times)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

from test_bench_smoke import ROOT, run_bench

VARIANTS = ("tcp-tcp", "tcp-zmq", "zmq-tcp")
FIELDS = {"cpu_us_per_msg", "wakeups_per_msg"}
# Few messages, 1 ms apart: the whole run is about a second (each variant's source waits
# 0.3 s for its relay). Every socket is bound on port 0 by the process that uses it.
TINY = ("--messages", "20", "--gap-ms", "1")


def test_json_has_both_numbers_of_every_variant() -> None:
    results = json.loads(run_bench("paced_hop.py", *TINY, "--json").stdout)
    assert set(results) == set(VARIANTS)
    for variant, got in results.items():
        assert set(got) == FIELDS, variant
        for field, value in got.items():
            assert math.isfinite(value) and value >= 0, (variant, field, value)
        assert got["cpu_us_per_msg"] > 0, variant


def test_the_table_has_a_row_of_numbers_per_variant() -> None:
    out = run_bench("paced_hop.py", *TINY, "--variants", "tcp-tcp,zmq-tcp").stdout
    assert out.startswith("20 messages, 1 ms apart, per message of the relay:")
    rows = re.findall(r"^\| ([a-z-]+) \| ([0-9.]+) \| ([0-9.]+) \|$", out, re.MULTILINE)
    assert [row[0] for row in rows] == ["tcp-tcp", "zmq-tcp"], out
    for variant, cpu_us, wakeups in rows:
        assert float(cpu_us) > 0 and float(wakeups) >= 0, (variant, cpu_us, wakeups)


def test_an_unknown_variant_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "paced_hop.py"), "--variants", "udp-tcp"],
        cwd=ROOT / "bench", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown variants ['udp-tcp']" in done.stderr
    assert "Traceback" not in done.stderr
