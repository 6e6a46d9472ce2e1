"""`switchyard preprocessor`: flags and process entry (uvicorn on uvloop + httptools)."""

from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn

from switchyard.common import endpoints
from switchyard.common.logs import setup_logging
from switchyard.preprocessor.app import create_app
from switchyard.preprocessor.state import PreprocessorConfig, PreprocessorState


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=endpoints.HTTP_HOST)
    parser.add_argument("--port", type=int, default=endpoints.HTTP_PORT)
    parser.add_argument(
        "--router",
        action="append",
        default=None,
        help=f"router ZMQ endpoint (repeat for replicas; default {endpoints.ROUTER})",
    )
    parser.add_argument(
        "--dispatcher",
        action="append",
        default=None,
        help="dispatcher ZMQ endpoint (repeat for replicas)",
    )
    parser.add_argument("--fleet-control", default=endpoints.FLEET_CONTROL)
    parser.add_argument("--fleet-events", default=endpoints.FLEET_EVENTS)
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="tokenizer folder; default: fetched from an engine (GetTokenizer)",
    )
    parser.add_argument("--route-timeout", type=float, default=5.0)
    parser.add_argument(
        "--stream-idle-timeout",
        type=float,
        default=60.0,
        help="seconds without a reply after which a stream counts as failed",
    )
    parser.add_argument("--migration-limit", type=int, default=3)
    parser.add_argument("--log-level", default="INFO")


def run(args: argparse.Namespace) -> int:
    setup_logging("preprocessor", args.log_level)
    config = PreprocessorConfig(
        routers=args.router or [endpoints.ROUTER],
        dispatchers=args.dispatcher or [endpoints.DISPATCHER],
        fleet_control=args.fleet_control,
        fleet_events=args.fleet_events,
        tokenizer_dir=args.tokenizer,
        route_timeout=args.route_timeout,
        stream_idle_timeout=args.stream_idle_timeout,
        migration_limit=args.migration_limit,
    )
    app = create_app(PreprocessorState(config))
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        log_config=None,
    )
    return 0
