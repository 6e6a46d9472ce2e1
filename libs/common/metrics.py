"""Prometheus exposition shared by the services: each service builds its own registry (no
global singleton) and serves it on --metrics-host/--metrics-port.

Each service has a known default port (see DEFAULT_PORTS and README's table): fleet 7190,
router 7290, dispatcher 7390 (their ZMQ ports + 90); the preprocessor serves GET /metrics on
its HTTP port as well. A default port that is taken (several services of one kind on a host)
is replaced by a free one of --port-range, with a warning and in the ready file; a port given
explicitly that is taken is an error. `--metrics-port off` serves none, `0` a free one.
"""

from __future__ import annotations

import argparse
import logging

from prometheus_client import CollectorRegistry, start_http_server

from switchyard.common.ports import PortRange, bind_in_range

log = logging.getLogger(__name__)

DEFAULT_PORTS = {
    "fleet": 7190,
    "router": 7290,
    "dispatcher": 7390,
    "preprocessor": None,
    "mock-engine": None,
}


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


def serve_metrics(
    registry: CollectorRegistry, host: str, port: int | None, ports: PortRange | None = None
) -> int | None:
    """Serve /metrics; returns the bound port (port 0: a free one of `ports`), None if off."""
    if port is None:
        return None

    def attempt(candidate: int) -> int:
        start_http_server(candidate, addr=host, registry=registry)
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
