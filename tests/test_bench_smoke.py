"""Smoke test of the load benchmark: its tiny configuration runs end to end and writes a table
with the floor and Switchyard rows. No timed assertions; matplotlib is not required."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from switchyard.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parent.parent


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run bench/<script> with `args` (from bench/, as its imports expect); fail on an error."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT / "bench",
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_load_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run_bench("load.py", "--quick", "--no-plots", "--out-dir", str(out))

    table = (out / "load.md").read_text()
    assert "| floor (gRPC direct) | 1 |" in table
    assert "| switchyard round_robin | 1 |" in table
    assert "| switchyard kv | 1 |" in table
    assert "not run (pass --with-smg)" in table

    results = json.loads((out / "load.json").read_text())
    by_key = {t["key"]: t for t in results["targets"]}
    for key in ("floor", "switchyard-round_robin", "switchyard-kv"):
        target = by_key[key]
        assert target["status"] == "ok", target["status"]
        assert set(target["phases"]) == {"c1", "c32", "c128", "open 20/s"}
        for name, phase in target["phases"].items():
            where = f"{key} {name}"
            assert phase["errors"] == 0, (where, phase["first_error"])
            assert phase["n"] > 0, where
            for field in ("req_s", "tok_s", "ttft_p50", "ttft_p99", "itl_p50", "e2e_p50"):
                assert phase[field] > 0, (where, field, phase[field])
            assert phase["ttft_p50"] <= phase["e2e_p50"], where
            cpu = phase["cpu_per_1k"]
            assert cpu["client"] > 0 and cpu["engines"] > 0, (where, cpu)
            if key != "floor":
                assert cpu["frontend"] > 0, (where, cpu)
                assert {"preprocessor", "dispatcher", "router", "fleet"} <= set(
                    phase["cpu"]["frontend"]
                ), (where, phase["cpu"]["frontend"])
    assert by_key["smg"]["status"].startswith("not run")


def test_long_prompts_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "long_prompts.md"
    run_bench(
        "long_prompts.py", "--seconds", "2", "--streams", "2", "--max-tokens", "8",
        "--long-every", "0.5", "--out", str(out),
    )  # fmt: skip
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")]
    names = [row.split("|")[1].strip() for row in rows[1:]]  # after the header
    assert names == ["offloaded (default)", "inline"]
    for row in rows[1:]:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert float(cells[1]) > 0 and int(cells[-2]) > 0 and int(cells[-1]) > 0, row


def test_hotspots_cpu_only_tiny(tmp_path: Path) -> None:
    done = run_bench(
        "hotspots.py", "--no-spy", "--requests", "24", "--concurrency", "4", "--out",
        str(tmp_path),
    )  # fmt: skip
    assert "24 requests at concurrency 4" in done.stdout
    assert "CPU seconds per 1000 requests: stack" in done.stdout
    assert "preprocessor threads:" in done.stdout


def test_parsers_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "parsers.md"
    run_bench("parsers.py", "--repeat", "2", "--out", str(out))
    table = out.read_text()
    for stream in ("plain (no markup)", "reasoning + answer", "answer + 2 tool calls"):
        assert table.count(f"| {stream} |") == 2, table
    assert "| stream | off | tools | ratio | reasoning + tools | ratio |" in table


def test_token_delta_codec_tiny() -> None:
    done = run_bench("token_delta.py", "--batch", "4", "--rounds", "50")
    for row in ("| before |", "| no logprobs |", "| logprobs, top 0 |", "| logprobs, top 5 |"):
        assert row in done.stdout, done.stdout


def test_stages_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run_bench("stages.py", "--quick", "--out-dir", str(out))
    table = (out / "stages.md").read_text()
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("| run |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    rows = [line for line in lines if line.startswith(("| streamed", "| whole"))]
    assert len(rows) == 2
    for row in rows:
        cells = dict(zip(columns, (c.strip() for c in row.strip("|").split("|")), strict=True))
        for stage in ("parse", "template", "tokenize"):
            assert float(cells[stage]) > 0, row  # the stages were timed
        assert float(cells["route p50"]) > 0 and float(cells["TTFT p50 ms"]) > 0, row
        if row.startswith("| streamed"):  # each first-token clock holds the next one
            engine, pre = float(cells["at the engine"]), float(cells["in the preprocessor"])
            assert 0 < engine < pre < float(cells["TTFT mean ms"]), row
        else:  # a whole reply has no first token before its last
            assert cells["at the engine"] == cells["in the preprocessor"] == "-", row
    assert "| cached segments |" in table and "| full encode |" in table


def test_kv_conversations_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "kv_conversations.md"
    run_bench(
        "kv_conversations.py", "--fleets", "sglang", "--concurrency", "2", "--conversations",
        "2", "--turns", "2", "--no-bursts", "--modes", "kv", "--no-reference",
        "--prefill-ms-per-token", "0.05", "--out", str(out),
    )  # fmt: skip
    rows = [line for line in out.read_text().splitlines() if line.startswith("| sglang")]
    assert [row.split("|")[3].strip() for row in rows] == ["kv"]
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]
    assert cells[3].endswith("%") and float(cells[6]) > 0, rows[0]  # hit rate, TTFT mean


def test_operability_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run_bench("operability.py", "--quick", "--out-dir", str(out))
    table = (out / "operability.md").read_text()
    variants = ("off", "access text", "access json", "tracing", "tracing 10%", "json+tracing")
    for variant in variants:
        assert f"| {variant} |" in table, table
    result = json.loads((out / "operability.json").read_text())
    assert result["spans_exported"] > 0  # the traced variants really exported spans
    for name, variant in result["variants"].items():
        assert variant["req_s"] and all(r > 0 for r in variant["req_s"]), name


def test_startup_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run_bench("startup.py", "--quick", "--out-dir", str(out))
    results = json.loads((out / "startup.json").read_text())
    assert set(results) == set(SUBCOMMANDS)  # every subcommand is timed
    assert set(results["router"]) == {"parse", "ready"}
    for name, measures in results.items():
        for measure, times in measures.items():
            assert times["eager"] and times["lazy"], (name, measure)
            assert min(times["eager"] + times["lazy"]) > 0, (name, measure)
