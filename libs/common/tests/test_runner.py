from __future__ import annotations

import argparse
import asyncio
import errno
import socket
from collections.abc import Callable

import httpx
import pytest
import zmq
from prometheus_client import CollectorRegistry, Counter

from switchyard.common.runner import run_service, unless_stopped


async def test_a_wait_that_finishes_first_is_true() -> None:
    assert await unless_stopped(asyncio.sleep(0), asyncio.Event())


async def test_a_stop_first_cancels_the_wait() -> None:
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    stop = asyncio.Event()
    asyncio.get_running_loop().call_soon(stop.set)
    assert not await unless_stopped(forever(), stop)
    assert cancelled.is_set()


async def test_an_error_of_the_wait_is_raised() -> None:
    async def fails() -> None:
        raise ValueError("no fleet")

    with pytest.raises(ValueError, match="no fleet"):
        await unless_stopped(fails(), asyncio.Event())


async def test_cancelling_the_caller_cancels_the_wait() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.create_task(unless_stopped(forever(), asyncio.Event()))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(cancelled.wait(), 5)


# ---- run_service ----------------------------------------------------------------------------


class FakeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        Counter("things", "things counted", registry=self.registry).inc(3)


class FakeService:
    """Binds "tcp://127.0.0.1:7300" (calls on_bound) unless told to fail before, then fails
    after if told to, else returns at once (as a stopped service does)."""

    def __init__(
        self, before: BaseException | None = None, after: BaseException | None = None
    ) -> None:
        self.metrics = FakeMetrics()
        self.before = before
        self.after = after
        self.ran = False

    async def run(
        self,
        stop: asyncio.Event,
        *,
        ports: object = None,
        on_bound: Callable[[str], None] | None = None,
    ) -> None:
        self.ran = True
        if self.before is not None:
            raise self.before
        if on_bound is not None:
            on_bound("tcp://127.0.0.1:7300")
        if self.after is not None:
            raise self.after


def run(service: FakeService, metrics_port: int | None = None) -> tuple[str | None, list]:
    reports: list = []
    failed = run_service(
        lambda: service,
        lambda s, endpoint, port: reports.append((s, endpoint, port)),
        argparse.Namespace(metrics_host="127.0.0.1", metrics_port=metrics_port, port_range=None),
    )
    return failed, reports


class TestRunService:
    def test_a_service_that_ran_reports_its_endpoint_and_no_failure(self):
        service = FakeService()
        assert run(service) == (None, [(service, "tcp://127.0.0.1:7300", None)])

    def test_on_bound_is_given_the_metrics_port_it_serves(self):
        service = FakeService()
        failed, [(_, _, port)] = run(service, metrics_port=0)
        assert failed is None and isinstance(port, int) and port > 0
        reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert "things_total 3.0" in reply.text

    def test_a_taken_metrics_port_is_one_line_and_the_service_never_runs(self):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            service = FakeService()
            failed, reports = run(service, metrics_port=port)
        assert failed is not None
        assert failed.startswith(f"cannot serve /metrics on 127.0.0.1:{port}: ")
        assert reports == [] and not service.ran

    @pytest.mark.parametrize(
        "error",
        [OSError(errno.EADDRINUSE, "Address already in use"), zmq.ZMQError(errno.EADDRINUSE)],
        ids=["os", "zmq"],
    )
    def test_an_error_before_the_bind_is_one_line(self, error):
        failed, reports = run(FakeService(before=error))
        assert failed == str(error) and reports == []

    def test_an_error_after_the_bind_is_raised(self):
        """Once bound, an OSError is no start-up failure: it is raised, with its traceback."""
        with pytest.raises(OSError, match="lost"):
            run(FakeService(after=OSError("lost")))

    def test_another_error_before_the_bind_is_raised(self):
        with pytest.raises(ValueError, match="bug"):
            run(FakeService(before=ValueError("bug")))
