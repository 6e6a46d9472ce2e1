"""Prometheus exposition shared by the services: each service builds its own registry (no
global singleton) and serves it on --metrics-host/--metrics-port (off when no port)."""

from __future__ import annotations

import argparse
import logging

from prometheus_client import CollectorRegistry, start_http_server

from switchyard.common.ports import PortRange, bind_in_range

log = logging.getLogger(__name__)


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-host", default="127.0.0.1")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics on this port (0: a free one; default: off)",
    )


def serve_metrics(
    registry: CollectorRegistry, host: str, port: int | None, ports: PortRange | None = None
) -> int | None:
    """Serve /metrics; returns the bound port (port 0: a free one of `ports`), None if off."""
    if port is None:
        return None

    def attempt(candidate: int) -> int:
        start_http_server(candidate, addr=host, registry=registry)
        return candidate

    bound = bind_in_range(attempt, ports) if port == 0 else attempt(port)
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return bound
