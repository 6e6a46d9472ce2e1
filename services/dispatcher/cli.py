"""`switchyard dispatcher`: flags and process entry."""

from __future__ import annotations

import argparse
import asyncio

from switchyard.common import endpoints
from switchyard.common.logs import setup_logging
from switchyard.common.metrics import add_metrics_arguments, serve_metrics
from switchyard.common.runner import run_until_signal
from switchyard.dispatcher.service import DispatcherService


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default=endpoints.DISPATCHER, help="ZMQ endpoint to serve on")
    parser.add_argument("--fleet-control", default=endpoints.FLEET_CONTROL)
    parser.add_argument("--fleet-events", default=endpoints.FLEET_EVENTS)
    add_metrics_arguments(parser)
    parser.add_argument("--log-level", default="INFO")


def run(args: argparse.Namespace) -> int:
    setup_logging("dispatcher", args.log_level)

    async def main(stop: asyncio.Event) -> None:
        service = DispatcherService(args.bind, args.fleet_control, args.fleet_events)
        serve_metrics(service.metrics.registry, args.metrics_host, args.metrics_port)
        await service.run(stop)

    return run_until_signal(main)
