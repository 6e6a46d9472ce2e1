"""`switchyard router`: flags and process entry."""

from __future__ import annotations

import argparse
import asyncio

from switchyard.common import endpoints
from switchyard.common.logs import setup_logging
from switchyard.common.runner import run_until_signal
from switchyard.router.core import RouterCore
from switchyard.router.load import InFlightTracker
from switchyard.router.policies import POLICIES, build_policy
from switchyard.router.service import RouterService


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default=endpoints.ROUTER, help="ZMQ endpoint to serve on")
    parser.add_argument("--fleet-control", default=endpoints.FLEET_CONTROL)
    parser.add_argument("--fleet-events", default=endpoints.FLEET_EVENTS)
    parser.add_argument("--router-mode", choices=sorted(POLICIES), default="round_robin")
    parser.add_argument(
        "--request-ttl",
        type=float,
        default=600.0,
        help="seconds after which an unfinished request stops counting as load",
    )
    parser.add_argument("--log-level", default="INFO")


def run(args: argparse.Namespace) -> int:
    setup_logging("router", args.log_level)

    async def main(stop: asyncio.Event) -> None:
        core = RouterCore(build_policy(args.router_mode), InFlightTracker(args.request_ttl))
        service = RouterService(core, args.bind, args.fleet_control, args.fleet_events)
        await service.run(stop)

    return run_until_signal(main)
