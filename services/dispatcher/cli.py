"""`switchyard dispatcher`: flags and process entry."""

from __future__ import annotations

import argparse
import asyncio

from switchyard.common import endpoints
from switchyard.common.logs import add_logging_arguments, setup_logging
from switchyard.common.metrics import add_metrics_arguments, serve_metrics
from switchyard.common.ports import add_port_arguments, write_ready_file
from switchyard.common.runner import run_until_signal
from switchyard.dispatcher.service import DEFAULT_STALL_TIMEOUT, DispatcherService


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bind",
        default=endpoints.DISPATCHER,
        help="ZMQ endpoint to serve on (port 0: a free one, see --ready-file)",
    )
    endpoints.add_fleet_arguments(parser)
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=DEFAULT_STALL_TIMEOUT,
        help="an engine whose streams already produced output and that then sends nothing on "
        "any stream this long (frozen) has all its streams failed, to migrate (0: off)",
    )
    add_metrics_arguments(parser, "dispatcher")
    add_port_arguments(parser)
    add_logging_arguments(parser)


def run(args: argparse.Namespace) -> int:
    logs = setup_logging("dispatcher", args.log_level, args.log_format)

    async def main(stop: asyncio.Event) -> None:
        service = DispatcherService(
            args.bind, args.fleet_control, args.fleet_events, args.stall_timeout or None
        )
        metrics_port = serve_metrics(
            service.metrics.registry, args.metrics_host, args.metrics_port, args.port_range
        )

        def bound(endpoint: str) -> None:
            logs.instance = endpoint
            write_ready_file(args.ready_file, {"bind": endpoint, "metrics_port": metrics_port})

        await service.run(stop, ports=args.port_range, on_bound=bound)

    return run_until_signal(main)
