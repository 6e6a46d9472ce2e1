"""The health check against real fleet, router and dispatcher processes (it is what the
Kubernetes exec probes and compose healthchecks run)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from switchyard.common.healthcheck import check
from switchyard.common.ports import free_port


@pytest.fixture(scope="module")
def services():
    control, events, router, dispatcher = (f"tcp://127.0.0.1:{free_port()}" for _ in range(4))
    fleet_flags = ["--fleet-control", control, "--fleet-events", events]
    argvs = {
        # An engine that never answers: fleet still serves its (empty) snapshot.
        "fleet": [
            "fleet",
            "--control",
            control,
            "--events",
            events,
            "--worker",
            "grpc://127.0.0.1:9",
        ],
        "router": ["router", "--bind", router, *fleet_flags],
        "dispatcher": ["dispatcher", "--bind", dispatcher, *fleet_flags],
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "switchyard", *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        for name, argv in argvs.items()
    }
    try:
        yield {"fleet": control, "router": router, "dispatcher": dispatcher}, procs
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=20)


def until_healthy(kind: str, endpoint: str) -> None:
    deadline = time.monotonic() + 30
    while (problem := check(kind, endpoint, 1.0)) is not None:
        if time.monotonic() > deadline:
            raise AssertionError(problem)


@pytest.mark.parametrize("kind", ["fleet", "router", "dispatcher"])
def test_a_running_service_answers(services, kind):
    endpoints, procs = services
    until_healthy(kind, endpoints[kind])
    done = subprocess.run(
        [sys.executable, "-m", "switchyard.common.healthcheck", kind, endpoints[kind]],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert procs[kind].poll() is None


def test_nobody_listening_is_unhealthy():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "switchyard.common.healthcheck",
            "router",
            endpoint,
            "--timeout",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "no answer within 0.5 s" in done.stderr


def test_the_wrong_service_on_the_port_is_unhealthy(services):
    endpoints, _ = services
    until_healthy("fleet", endpoints["fleet"])
    # A router's reply decoded as fleet's: the probe was pointed at the wrong port.
    problem = check("fleet", endpoints["router"], 3.0)
    assert problem is not None
