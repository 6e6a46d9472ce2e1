"""Process entry shared by every service: uvloop, and a clean stop on SIGINT/SIGTERM;
`run_service`, the main of a ZMQ service (router, dispatcher) that serves /metrics too."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import zmq
from prometheus_client import CollectorRegistry

from switchyard.common.metrics import serve_metrics
from switchyard.common.ports import PortRange

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency; keep the fallback honest
    uvloop = None  # type: ignore[assignment]


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run `main(stop)` on uvloop; SIGINT/SIGTERM set `stop`, and main cleans up and returns."""

    async def wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    if uvloop is not None:
        uvloop.run(wrapper())
    else:
        asyncio.run(wrapper())
    return 0


async def unless_stopped(awaitable: Awaitable[object], stop: asyncio.Event) -> bool:
    """Await `awaitable` unless `stop` is set first, then cancel it: True when it finished.
    For the waits before a service serves (fleet not answering yet), so a SIGTERM then still
    stops the process at once instead of after the supervisor's kill timeout."""
    task = asyncio.ensure_future(awaitable)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        stopping.cancel()
    if task.done():
        task.result()  # its error, if it failed
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


class _Metrics(Protocol):
    @property
    def registry(self) -> CollectorRegistry: ...


class Service(Protocol):
    """What `run_service` runs: a service with its own metrics registry that binds its
    sockets, calls `on_bound(endpoint)` and serves until `stop`."""

    @property
    def metrics(self) -> _Metrics: ...

    async def run(
        self,
        stop: asyncio.Event,
        *,
        ports: PortRange | None = None,
        on_bound: Callable[[str], None] | None = None,
    ) -> None: ...


S = TypeVar("S", bound=Service)


def run_service(
    build: Callable[[], S],
    on_bound: Callable[[S, str, int | None], None],
    args: argparse.Namespace,
) -> str | None:
    """Build the service on the loop, serve its /metrics, run it until SIGINT/SIGTERM;
    `on_bound(service, endpoint, metrics port)` once its socket is bound (the ready file).
    `args` has the flags of `add_metrics_arguments` and `add_port_arguments`.

    A start-up failure (the /metrics port or the service's own address taken or not ours)
    is returned as one line for the caller to report, with no traceback; None when the
    service ran and stopped. An OSError or ZMQError once the service was bound is no
    start-up failure: it is raised as it is."""
    metrics_host: str = args.metrics_host
    metrics_port: int | None = args.metrics_port
    ports: PortRange | None = args.port_range
    started = False
    failed: list[str] = []

    async def main(stop: asyncio.Event) -> None:
        nonlocal started
        service = build()
        try:
            bound_metrics = serve_metrics(
                service.metrics.registry, metrics_host, metrics_port, ports
            )
        except OSError as exc:
            failed.append(f"cannot serve /metrics on {metrics_host}:{metrics_port}: {exc}")
            return

        def bound(endpoint: str) -> None:
            nonlocal started
            started = True
            on_bound(service, endpoint, bound_metrics)

        try:
            await service.run(stop, ports=ports, on_bound=bound)
        except (OSError, zmq.ZMQError) as exc:
            if started:
                raise
            failed.append(str(exc))  # a port taken, an address not ours

    run_until_signal(main)
    return failed[0] if failed else None
