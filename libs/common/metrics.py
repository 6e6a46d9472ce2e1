"""Prometheus exposition shared by the services: each service builds its own registry (no
global singleton) and serves it on --metrics-host/--metrics-port (off when no port)."""

from __future__ import annotations

import argparse
import logging

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-host", default="127.0.0.1")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics on this port (default: off)",
    )


def serve_metrics(registry: CollectorRegistry, host: str, port: int | None) -> None:
    if port is None:
        return
    start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, port)
