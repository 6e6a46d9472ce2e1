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


def zmq_endpoint(text: str) -> str:
    """argparse type of a ZMQ endpoint flag: `transport://address`, and for tcp:// a port of
    0..65535 or `*`. Checked at parse time: libzmq's own error is a traceback at the first
    bind or connect, and it takes a tcp port over 65535 modulo 65536 (a bind to :99999
    listens on :34463)."""
    transport, sep, address = text.partition("://")
    if not sep or not transport or not address:
        raise argparse.ArgumentTypeError(
            f"expected a ZMQ endpoint like tcp://127.0.0.1:7100, got {text!r}"
        )
    if transport == "tcp":
        _, colon, port = address.rpartition(":")
        if not colon or not (port == "*" or (port.isdigit() and int(port) <= 65535)):
            raise argparse.ArgumentTypeError(
                f"expected tcp://HOST:PORT with a port of 0-65535 or *, got {text!r}"
            )
    return text


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """Where a service that follows fleet's instance set finds fleet."""
    parser.add_argument(
        "--fleet-control",
        type=zmq_endpoint,
        default=FLEET_CONTROL,
        help="fleet's control endpoint (snapshots, instance-down reports)",
    )
    parser.add_argument(
        "--fleet-events",
        type=zmq_endpoint,
        default=FLEET_EVENTS,
        help="fleet's PUB endpoint (instance updates)",
    )
