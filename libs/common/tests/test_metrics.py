"""serve_metrics: /metrics answered at once by a server thread that does not poll."""

from __future__ import annotations

import socket
import time

import httpx
from prometheus_client import CollectorRegistry, Counter

from switchyard.common import metrics


def thread_wakeups(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status") as status:
        return int(status.read().split("\nvoluntary_ctxt_switches:")[1].split()[0])


class TestServeMetrics:
    def test_serves_the_registry(self):
        registry = CollectorRegistry()
        Counter("things", "things counted", registry=registry).inc(3)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        assert metrics.serve_metrics(registry, "127.0.0.1", port) == port
        reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert reply.status_code == 200
        assert "things_total 3.0" in reply.text

    def test_the_idle_thread_sleeps(self):
        """Idle burn (issue 13): prometheus_client's server thread woke twice a second."""
        thread = metrics.start_server(0, "127.0.0.1", CollectorRegistry())
        assert thread.native_id is not None
        time.sleep(0.1)
        before = thread_wakeups(thread.native_id)
        time.sleep(1.2)
        assert thread_wakeups(thread.native_id) - before == 0


class TestServiceRegistry:
    def test_process_series_build_info_and_no_created(self):
        from prometheus_client import Counter, Histogram, generate_latest

        from switchyard.common.metrics import service_registry, version

        registry = service_registry("router")
        Counter("switchyard_test_things", "things", registry=registry).inc()
        Histogram("switchyard_test_seconds", "time", registry=registry).observe(0.1)
        text = generate_latest(registry).decode()
        for name in (
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ):
            assert f"\n{name} " in text, name
        assert 'switchyard_build_info{python="' in text
        line = next(x for x in text.splitlines() if x.startswith("switchyard_build_info{"))
        assert 'service="router"' in line and f'version="{version()}"' in line
        assert line.endswith(" 1.0")
        assert "_created" not in text


def test_a_free_default_port_is_served_as_is():
    """Regression: getaddrinfo refused the DefaultPort int subclass ("Int or String
    expected"), so every service that kept its default metrics port (the compose stack's
    fleet, router and dispatcher) served on a random one instead, where Prometheus never
    looked."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bound = metrics.serve_metrics(CollectorRegistry(), "127.0.0.1", metrics.DefaultPort(port))
    assert bound == port
