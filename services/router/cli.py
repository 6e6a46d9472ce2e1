"""`switchyard router`: flags and process entry."""

from __future__ import annotations

import argparse
import asyncio

from switchyard.common import endpoints
from switchyard.common.engines.tls import add_engine_tls_arguments, engine_tls_from_args
from switchyard.common.logs import setup_logging
from switchyard.common.metrics import add_metrics_arguments, serve_metrics
from switchyard.common.ports import add_port_arguments, write_ready_file
from switchyard.common.runner import run_until_signal
from switchyard.router.core import DEFAULT_DISAGG_MIN_UNCACHED_TOKENS, RouterCore
from switchyard.router.load import InFlightTracker
from switchyard.router.policies import MODES, KvParams, build_policy
from switchyard.router.service import RouterService


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bind",
        default=endpoints.ROUTER,
        help="ZMQ endpoint to serve on (port 0: a free one, see --ready-file)",
    )
    parser.add_argument("--fleet-control", default=endpoints.FLEET_CONTROL)
    parser.add_argument("--fleet-events", default=endpoints.FLEET_EVENTS)
    parser.add_argument("--router-mode", choices=MODES, default="kv")
    parser.add_argument(
        "--kv-overlap-weight",
        type=float,
        default=1.0,
        help="weight of prefill blocks against decode blocks in the KV cost",
    )
    parser.add_argument(
        "--kv-temperature",
        type=float,
        default=0.0,
        help="0: always the cheapest worker; >0: softmax sampling over costs",
    )
    parser.add_argument(
        "--disagg-min-uncached-tokens",
        type=int,
        default=DEFAULT_DISAGG_MIN_UNCACHED_TOKENS,
        help="skip the prefill hop when a decode engine that can prefill has fewer uncached "
        "prompt tokens than this (default %(default)s; a chosen default, not measured)",
    )
    parser.add_argument(
        "--request-ttl",
        type=float,
        default=600.0,
        help="seconds after which an unfinished request stops counting as load",
    )
    add_engine_tls_arguments(parser)  # SubscribeKvEvents over grpcs://
    add_metrics_arguments(parser)
    add_port_arguments(parser)
    parser.add_argument("--log-level", default="INFO")


def run(args: argparse.Namespace) -> int:
    setup_logging("router", args.log_level)
    kv_params = KvParams(args.kv_overlap_weight, args.kv_temperature)
    try:
        tls = engine_tls_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"router: {exc}") from None

    async def main(stop: asyncio.Event) -> None:
        core = RouterCore(
            build_policy(args.router_mode, kv_params=kv_params),
            InFlightTracker(args.request_ttl),
            disagg_min_uncached_tokens=args.disagg_min_uncached_tokens,
        )
        service = RouterService(core, args.bind, args.fleet_control, args.fleet_events, tls=tls)
        metrics_port = serve_metrics(
            service.metrics.registry, args.metrics_host, args.metrics_port, args.port_range
        )

        def bound(endpoint: str) -> None:
            write_ready_file(args.ready_file, {"bind": endpoint, "metrics_port": metrics_port})

        await service.run(stop, ports=args.port_range, on_bound=bound)

    return run_until_signal(main)
