"""`switchyard kv-proxy` as a process: ports 0 bound and reported in its ready file (rank r
at rank 0's port + r), a clean stop on SIGTERM, and a bind failure reported, not a traceback."""

import signal
import subprocess
import sys

import zmq

from switchyard.common.ports import read_ready_file


def start(tmp_path, *argv: str, output=subprocess.DEVNULL):
    ready = tmp_path / "proxy.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchyard", "kv-proxy", *argv, "--ready-file", str(ready)],
        stdout=output,
        stderr=subprocess.STDOUT,
    )
    return proc, ready


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_port_0_is_reported_per_rank(tmp_path):
    proc, ready = start(
        tmp_path, "--frontend", "tcp://127.0.0.1:0", "--backend", "tcp://127.0.0.1:0",
        "--ranks", "2",
    )  # fmt: skip
    try:
        report = read_ready_file(ready, proc, 30)
        fronts, backs = report["frontends"], report["backends"]
        assert len(fronts) == len(backs) == 2
        assert port_of(fronts[0]) != 0 and port_of(fronts[1]) == port_of(fronts[0]) + 1
        assert port_of(backs[1]) == port_of(backs[0]) + 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_a_port_taken_is_a_clean_error(tmp_path):
    ctx = zmq.Context()
    taken = ctx.socket(zmq.PUB)
    try:
        port = taken.bind_to_random_port("tcp://127.0.0.1")
        proc, _ = start(
            tmp_path, "--frontend", f"tcp://127.0.0.1:{port}", "--backend", "tcp://127.0.0.1:0",
            output=subprocess.PIPE,
        )  # fmt: skip
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 2
        assert b"cannot bind" in out and b"Traceback" not in out
    finally:
        taken.close(linger=0)
        ctx.term()
