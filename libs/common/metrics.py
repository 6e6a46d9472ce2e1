"""Prometheus exposition shared by the services: each service builds its own registry (no
global singleton: `service_registry`) and serves it on --metrics-host/--metrics-port.

Every service's registry also has the process_* series of prometheus-client's ProcessCollector
(CPU seconds, resident and virtual memory, open and maximum file descriptors, start time) and
`switchyard_build_info{service, version, python}` (always 1). No `<name>_created` series:
prometheus-client adds one per counter, histogram and summary series (a second series for each,
which nothing here reads), turned off for the process when this module is imported.

Each service has a known default port (see DEFAULT_PORTS and docs/operating.md's table): fleet 7190,
router 7290, dispatcher 7390 (their ZMQ ports + 90); the preprocessor serves GET /metrics on
its HTTP port as well. A default port that is taken (several services of one kind on a host)
is replaced by a free one of --port-range, with a warning and in the ready file; a port given
explicitly that is taken is an error. `--metrics-port off` serves none, `0` a free one.
"""

from __future__ import annotations

import argparse
import logging
import platform
import socket
import threading
from collections.abc import Iterator
from importlib import metadata
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    CollectorRegistry,
    ProcessCollector,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from switchyard.common.ports import PortRange, bind_in_range

log = logging.getLogger(__name__)

disable_created_metrics()

DEFAULT_PORTS = {
    "fleet": 7190,
    "router": 7290,
    "dispatcher": 7390,
    "preprocessor": None,
    "mock-engine": None,
}


def version() -> str:
    try:
        return metadata.version("switchyard")
    except metadata.PackageNotFoundError:  # a bare checkout, not installed
        return "unknown"


class _BuildInfo(Collector):
    def __init__(self, service: str) -> None:
        self._labels = [service, version(), platform.python_version()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "switchyard_build_info",
            "1, labelled with the service, the Switchyard version and the Python version",
            labels=["service", "version", "python"],
        )
        info.add_metric(self._labels, 1.0)
        yield info


def service_registry(service: str) -> CollectorRegistry:
    """A service's own registry, with the process_* series and switchyard_build_info."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(_BuildInfo(service))
    return registry


class DefaultPort(int):
    """The flag's default (not given by the operator): a free port replaces it if taken."""


def metrics_port(text: str) -> int | None:
    if text.strip().lower() == "off":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port, 0 or off, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {value}")
    return value


def add_metrics_arguments(parser: argparse.ArgumentParser, service: str) -> None:
    default = DEFAULT_PORTS[service]
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", help="address the /metrics port listens on"
    )
    parser.add_argument(
        "--metrics-port",
        type=metrics_port,
        default=DefaultPort(default) if default is not None else None,
        metavar="PORT|0|off",
        help="serve Prometheus /metrics on this port (0: a free one of --port-range; off: none)"
        + (
            "; a taken default port is replaced by a free one (logged, and in --ready-file)"
            if default is not None
            else "; default: off, /metrics is served on the HTTP port"
            if service == "preprocessor"
            else "; default: off"
        ),
    )


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        """No line per scrape."""


# How often the server thread wakes to look for a shutdown() nobody calls (it is a daemon
# thread): prometheus_client's start_http_server polls every 0.5 s, 2 wake-ups a second of
# every idle service. Requests are answered as they come either way.
POLL_INTERVAL_S = 3600.0


def start_server(port: int, host: str, registry: CollectorRegistry) -> threading.Thread:
    """prometheus_client's start_http_server (a thread per scrape, no request log, the
    address family of `host`), with a server thread that sleeps until a request comes."""
    port = int(port)  # getaddrinfo refuses an int subclass (a DefaultPort): "Int or String"
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
    httpd: ThreadingWSGIServer = make_server(
        str(sockaddr[0]), port, make_wsgi_app(registry), server_class, handler_class=_Quiet
    )
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": POLL_INTERVAL_S}, daemon=True
    )
    thread.start()
    return thread


def serve_metrics(
    registry: CollectorRegistry, host: str, port: int | None, ports: PortRange | None = None
) -> int | None:
    """Serve /metrics; returns the bound port (port 0: a free one of `ports`), None if off."""
    if port is None:
        return None

    def attempt(candidate: int) -> int:
        start_server(candidate, host, registry)
        return candidate

    if port == 0:
        bound = bind_in_range(attempt, ports)
    else:
        try:
            bound = attempt(port)
        except OSError as exc:
            if not isinstance(port, DefaultPort):
                raise
            bound = bind_in_range(attempt, ports)
            log.warning("metrics port %d is taken (%s): serving on %d instead", port, exc, bound)
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return bound
