"""Default ZMQ endpoints of the local stack. Every service takes them as flags; these are the
values `switchyard up` and a single-host deployment use."""

from __future__ import annotations

import argparse

FLEET_CONTROL = "tcp://127.0.0.1:7100"
FLEET_EVENTS = "tcp://127.0.0.1:7101"
ROUTER = "tcp://127.0.0.1:7200"
DISPATCHER = "tcp://127.0.0.1:7300"
HTTP_HOST = "127.0.0.1"
HTTP_PORT = 8000


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """Where a service that follows fleet's instance set finds fleet."""
    parser.add_argument(
        "--fleet-control",
        default=FLEET_CONTROL,
        help="fleet's control endpoint (snapshots, instance-down reports)",
    )
    parser.add_argument(
        "--fleet-events", default=FLEET_EVENTS, help="fleet's PUB endpoint (instance updates)"
    )
