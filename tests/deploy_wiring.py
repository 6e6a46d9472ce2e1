"""What the deployment tests share: a container command parsed by switchyard's own argparse
parser, and the endpoints it binds and dials, so every client can be checked against a service
of the same stack that binds that port (compose and Kubernetes alike)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

ANY_HOST = {"*", "0.0.0.0"}


def parse_command(parser: argparse.ArgumentParser, where: str, argv: Any) -> argparse.Namespace:
    assert isinstance(argv, list) and argv, f"{where}: command must be a non-empty list"
    assert all(isinstance(item, str) for item in argv), (
        f"{where}: every command item must be a string (quote ports): {argv!r}"
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: `switchyard {' '.join(argv)}` does not parse (exit {exc.code})")
    assert args.command != "up", f"{where}: `switchyard up` is the single-host launcher"
    return args


@dataclass
class Wiring:
    """What one container binds ((kind, port) pairs) and dials ((flag, kind, url) triples).
    A kind names what the socket serves (fleet-control, fleet-events, router, dispatcher, grpc,
    http), so a client pointed at the right host but the wrong one of its ports is caught."""

    binds: set[tuple[str, int]] = field(default_factory=set)
    dials: list[tuple[str, str, str]] = field(default_factory=list)


def _zmq_bind(where: str, kind: str, flag: str, endpoint: str, wiring: Wiring) -> None:
    parts = urlsplit(endpoint)
    assert parts.scheme == "tcp" and parts.port, (
        f"{where}: {flag} {endpoint} is not tcp://host:port"
    )
    assert parts.hostname in ANY_HOST, (
        f"{where}: {flag} {endpoint} must bind tcp://*:PORT or tcp://0.0.0.0:PORT in a container"
    )
    wiring.binds.add((kind, parts.port))


def _host_bind(where: str, kind: str, host: str, port: int, wiring: Wiring) -> None:
    assert host == "0.0.0.0", f"{where}: --host {host} is unreachable from other containers"
    assert port > 0, f"{where}: a fixed --port is needed for others to dial it"
    wiring.binds.add((kind, port))


def wiring_of(where: str, args: argparse.Namespace) -> Wiring:
    wiring = Wiring()
    fleet_dials = [
        ("--fleet-control", "fleet-control", getattr(args, "fleet_control", None)),
        ("--fleet-events", "fleet-events", getattr(args, "fleet_events", None)),
    ]
    if args.command == "fleet":
        _zmq_bind(where, "fleet-control", "--control", args.control, wiring)
        _zmq_bind(where, "fleet-events", "--events", args.events, wiring)
        assert args.worker or args.workers_file or args.k8s_selector, (
            f"{where}: fleet needs --worker, --workers-file or --k8s-selector"
        )
        # A worker's kv_events/kv_replay options name the engine's own sockets, which the
        # mock engines do not have (they stream KV events over gRPC): not checked here.
        wiring.dials += [("--worker", "grpc", spec.url) for spec in args.worker]
        wiring.dials += [("--prefill", "grpc", url) for url in args.prefill]
    elif args.command in ("router", "dispatcher"):
        _zmq_bind(where, args.command, "--bind", args.bind, wiring)
        wiring.dials += fleet_dials
    elif args.command == "preprocessor":
        _host_bind(where, "http", args.host, args.port, wiring)
        assert args.dispatcher, f"{where}: give --dispatcher explicitly (the default is loopback)"
        assert args.router, f"{where}: give --router explicitly (the default is loopback)"
        wiring.dials += [("--router", "router", endpoint) for endpoint in args.router]
        wiring.dials += [("--dispatcher", "dispatcher", endpoint) for endpoint in args.dispatcher]
        wiring.dials += fleet_dials
    elif args.command == "mock-engine":
        _host_bind(where, "grpc", args.host, args.port, wiring)
    else:  # pragma: no cover - a new subcommand needs a rule here
        pytest.fail(f"{where}: no wiring rule for subcommand {args.command!r}")
    return wiring


def check_wiring(stack: str, commands: dict[str, argparse.Namespace]) -> None:
    """Every endpoint a container dials names a service of the stack binding that port."""
    wirings = {name: wiring_of(f"{stack}/{name}", args) for name, args in commands.items()}
    for name, wiring in wirings.items():
        for flag, kind, url in wiring.dials:
            parts = urlsplit(url)
            scheme = "grpc" if kind == "grpc" else "tcp"
            where = f"{stack}/{name}: {flag} {url}"
            assert parts.scheme == scheme and parts.hostname and parts.port, (
                f"{where}: expected {scheme}://<service>:<port>"
            )
            assert parts.hostname in wirings, (
                f"{where}: {parts.hostname!r} is not a service of this stack "
                f"({', '.join(sorted(wirings))})"
            )
            assert (kind, parts.port) in wirings[parts.hostname].binds, (
                f"{where}: {parts.hostname} binds {sorted(wirings[parts.hostname].binds)}, "
                f"not a {kind} endpoint on port {parts.port}"
            )
