"""The chaos matrix in CI: SIGKILL and SIGSTOP/SIGCONT each process kind of a `switchyard up`
stack under steady streaming load (bench/chaos_matrix.py in a compact configuration, all
kinds on one stack). Only streams open on a killed preprocessor may fail, and no stream may
differ from the undisturbed run. Run with -s to see the table; no timed assertions."""

from __future__ import annotations

import json
from pathlib import Path

from test_bench_smoke import run_bench

# Short timeouts so that a compact run shows each fault being handled: the gap timeout
# moves streams off a frozen engine, the route timeout skips a frozen router.
COMPACT = [
    "--one-stack", "--clients", "4", "--prompts", "8", "--max-tokens", "20",
    "--load-seconds", "3", "--fault-at", "0.5", "--freeze-seconds", "2",
    "--preprocessor-arg=--stream-gap-timeout=0.8",
    "--preprocessor-arg=--stream-idle-timeout=5",
    "--preprocessor-arg=--route-timeout=1",
]  # fmt: skip

CONNECTION_ERRORS = ("APIConnectionError", "RemoteProtocolError", "ReadError", "ConnectError")


def test_chaos_matrix(tmp_path: Path) -> None:
    out = tmp_path / "cases.json"
    done = run_bench("chaos_matrix.py", *COMPACT, "--json", str(out))
    print("\n" + done.stdout)
    cases = json.loads(out.read_text())
    assert {(c["kind"], c["fault"]) for c in cases} == {
        (kind, fault)
        for kind in ("engine", "dispatcher", "router", "fleet", "preprocessor")
        for fault in ("kill", "stop")
    }
    for case in cases:
        name = f"{case['kind']} {case['fault']}"
        assert case["streams"] > 0, name
        assert case["different"] == 0, f"{name}: streams differ from the undisturbed run"
        if (case["kind"], case["fault"]) == ("preprocessor", "kill"):
            # Streams open on the killed process lose their connection; nothing else fails.
            for error in case["errors"]:
                assert error.startswith(CONNECTION_ERRORS), f"{name}: {error}"
        else:
            assert case["failed"] == 0, f"{name}: {case['errors']}"
