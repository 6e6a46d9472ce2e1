"""`switchyard fleet`: flags, wiring, and the run-until-signalled main."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop
import zmq

from switchyard.common import endpoints
from switchyard.common.argtypes import whole_number
from switchyard.common.engines.tls import add_engine_tls_arguments, engine_tls_from_args
from switchyard.common.logs import LogContext, add_logging_arguments, setup_logging
from switchyard.common.metrics import add_metrics_arguments, serve_metrics
from switchyard.common.ports import add_port_arguments, write_ready_file
from switchyard.common.workers import WorkerSpec, parse_worker
from switchyard.fleet.k8s import cli as k8s_cli
from switchyard.fleet.service import FleetService
from switchyard.fleet.source import WorkerSource
from switchyard.fleet.state import StateError, StateFile

log = logging.getLogger(__name__)


def _worker(text: str) -> WorkerSpec:
    try:
        return parse_worker(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--worker",
        action="append",
        default=[],
        type=_worker,
        metavar="URL",
        help="engine URL, repeatable: grpc://host:port[?kv_events=tcp://h:p&kv_replay=tcp://h:p"
        "&role=prefill]; kv_bind=tcp://*:p&kv_topic=T for an engine whose KV publisher "
        "connects to the router (see docs/routing.md)",
    )
    parser.add_argument(
        "--workers-file",
        type=Path,
        metavar="PATH",
        help="YAML (.yaml/.yml) or JSON (.json) list of workers, watched for edits",
    )
    parser.add_argument(
        "--prefill",
        action="append",
        default=[],
        metavar="URL",
        help="treat this engine URL as prefill when the engine does not say (repeatable)",
    )
    parser.add_argument(
        "--control",
        type=endpoints.zmq_endpoint,
        default=endpoints.FLEET_CONTROL,
        help="ROUTER endpoint for snapshots and down reports (port 0: a free one)",
    )
    parser.add_argument(
        "--events",
        type=endpoints.zmq_endpoint,
        default=endpoints.FLEET_EVENTS,
        help="PUB endpoint for instance updates",
    )
    parser.add_argument(
        "--readmit-after",
        type=whole_number(1),
        default=2,
        metavar="PROBES",
        help="consecutive good probes before an engine that was down is routable again",
    )
    parser.add_argument(
        "--down-after",
        type=whole_number(1),
        default=3,
        metavar="PROBES",
        help="consecutive probes without an answer within --probe-timeout before a routable "
        "engine is taken out (a loaded engine may miss one); a refused or reset connection, "
        "an engine that says it is unhealthy, or a down report from a dispatcher takes it "
        "out at once",
    )
    parser.add_argument(
        "--probe-interval",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="re-probe every worker this often (default 2)",
    )
    parser.add_argument(
        "--probe-timeout",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="give up on a probe after this long (default 2)",
    )
    parser.add_argument(
        "--state-file",
        default=AUTO,
        metavar="PATH|auto|off",
        help="SQLite file where fleet keeps the admin API's changes (added workers, drain "
        "marks) and the instance set it publishes, restored at start; auto: "
        "<workers file>.state.sqlite beside --workers-file when its folder is writable, "
        "else none; off: none (admin changes last until fleet stops)",
    )
    parser.add_argument(
        "--state-max-age",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="restore the stored instance set (serve it at once, re-probe it within one "
        "probe interval) only when the state file was written this recently; older, every "
        "worker is probed afresh first (admin changes are restored at any age)",
    )
    k8s_cli.add_arguments(parser)
    add_engine_tls_arguments(parser)
    add_metrics_arguments(parser, "fleet")
    add_port_arguments(parser)
    add_logging_arguments(parser)


AUTO, OFF = "auto", "off"


def state_path(value: str, workers_file: Path | None) -> Path | None:
    """Where the state file is (see --state-file), or None for none."""
    if value == OFF:
        return None
    if value != AUTO:
        return Path(value)
    if workers_file is None:
        return None
    folder = workers_file.resolve().parent
    if not os.access(folder, os.W_OK):
        log.warning(
            "no state file: %s is not writable (a read-only mount?); admin changes will not "
            "survive a restart: give --state-file PATH",
            folder,
        )
        return None
    return folder / f"{workers_file.name}.state.sqlite"


def run(args: argparse.Namespace) -> int:
    logs = setup_logging("fleet", args.log_level, args.log_format)
    if not args.worker and args.workers_file is None and not args.k8s_selector:
        log.error("give at least one --worker, a --workers-file or a --k8s-selector")
        return 2
    return uvloop.run(_serve(args, logs))


async def _serve(args: argparse.Namespace, logs: LogContext | None = None) -> int:
    try:
        pods = k8s_cli.pod_source(args)
        tls = engine_tls_from_args(args)
    except ValueError as exc:
        log.error("fleet cannot start: %s", exc)
        return 2
    path = state_path(args.state_file, args.workers_file)
    if path is not None:
        log.info("state file %s", path)
    service = FleetService(
        WorkerSource(args.worker, args.workers_file, args.prefill),
        control=args.control,
        events=args.events,
        probe_interval=args.probe_interval,
        readmit_after=args.readmit_after,
        down_after=args.down_after,
        probe_timeout=args.probe_timeout,
        ports=args.port_range,
        pods=pods,
        tls=tls,
        state=StateFile(path) if path is not None else None,
        state_max_age=args.state_max_age,
    )
    try:
        await service.start()
        metrics_port = serve_metrics(
            service.metrics.registry, args.metrics_host, args.metrics_port, args.port_range
        )
    except (ValueError, OSError, zmq.ZMQError, StateError) as exc:
        log.error("fleet cannot start: %s", exc)
        await service.close()
        return 2
    if logs is not None:
        logs.instance = service.control_endpoint
    write_ready_file(
        args.ready_file,
        {
            "control": service.control_endpoint,
            "events": service.events_endpoint,
            "metrics_port": metrics_port,
        },
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
        log.info("fleet stopping")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await service.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m switchyard.fleet`: the same as `switchyard fleet` (config file and env too)."""
    from switchyard.cli import main as switchyard_main

    return switchyard_main(["fleet", *(sys.argv[1:] if argv is None else argv)])
