"""`switchyard dispatcher`: flags and process entry."""

from __future__ import annotations

import argparse

from switchyard.common import endpoints, heap
from switchyard.common.argtypes import seconds
from switchyard.common.engines.tls import add_engine_tls_arguments, engine_tls_from_args
from switchyard.common.logs import add_logging_arguments, setup_logging
from switchyard.common.metrics import add_metrics_arguments
from switchyard.common.ports import add_port_arguments, write_ready_file
from switchyard.common.runner import run_service
from switchyard.dispatcher.channels import DEFAULT_DRAIN_TIMEOUT
from switchyard.dispatcher.service import (
    DEFAULT_REPLY_WINDOW,
    DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_STALL_TIMEOUT,
    ENGINE_STREAMS,
    ENGINE_STREAMS_HTTP2,
    DispatcherService,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bind",
        type=endpoints.zmq_endpoint,
        default=endpoints.DISPATCHER,
        help="ZMQ endpoint to serve on (port 0: a free one, see --ready-file)",
    )
    endpoints.add_fleet_arguments(parser)
    parser.add_argument(
        "--stall-timeout",
        type=seconds,
        default=DEFAULT_STALL_TIMEOUT,
        help="an engine whose streams already produced output and that then sends nothing on "
        "any stream this long (frozen) has all its streams failed, to migrate (0: off)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=seconds,
        default=DEFAULT_DRAIN_TIMEOUT,
        metavar="SECONDS",
        help="an engine that leaves the routable set (removed, drained, down) takes no new "
        "streams; its running ones may finish this long, then migrate with their tokens so "
        f"far; its channel closes after its last stream (default {DEFAULT_DRAIN_TIMEOUT:g})",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=seconds,
        default=DEFAULT_SHUTDOWN_GRACE,
        metavar="SECONDS",
        help="on SIGTERM, running streams may finish this long; the rest then fail to migrate "
        f"through another dispatcher (default {DEFAULT_SHUTDOWN_GRACE:g})",
    )
    parser.add_argument(
        "--engine-streams",
        choices=ENGINE_STREAMS,
        default=ENGINE_STREAMS_HTTP2,
        help="how Generate streams reach the engines: http2, the event loop's own HTTP/2 "
        "connection (about half the CPU per token), or grpc, a grpc.aio channel; other calls "
        f"always use gRPC's channel (default {ENGINE_STREAMS_HTTP2})",
    )
    parser.add_argument(
        "--reply-window-ms",
        type=seconds,
        default=DEFAULT_REPLY_WINDOW * 1000,
        metavar="MS",
        help="under load, the replies for a preprocessor go out together at most once per this "
        "many milliseconds (the tokens of an engine's decode step arrive spread over a "
        "fraction of one); an idle dispatcher sends at once (0: every loop iteration; "
        f"default {DEFAULT_REPLY_WINDOW * 1000:g})",
    )
    add_engine_tls_arguments(parser)
    add_metrics_arguments(parser, "dispatcher")
    add_port_arguments(parser)
    add_logging_arguments(parser)


def run(args: argparse.Namespace) -> int:
    logs = setup_logging("dispatcher", args.log_level, args.log_format)
    try:
        tls = engine_tls_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"dispatcher: {exc}") from None

    def build() -> DispatcherService:
        return DispatcherService(
            args.bind,
            args.fleet_control,
            args.fleet_events,
            args.stall_timeout or None,
            drain_timeout=args.drain_timeout,
            shutdown_grace=args.shutdown_grace,
            tls=tls,
            engine_streams=args.engine_streams,
            reply_window=args.reply_window_ms / 1000,
        )

    def bound(service: DispatcherService, endpoint: str, metrics_port: int | None) -> None:
        logs.instance = endpoint
        heap.settle()  # the start-up heap, out of full collections
        write_ready_file(args.ready_file, {"bind": endpoint, "metrics_port": metrics_port})

    failed = run_service(build, bound, args)
    if failed is not None:
        raise SystemExit(f"dispatcher cannot start: {failed}")
    return 0
