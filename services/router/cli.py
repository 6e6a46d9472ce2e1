"""`switchyard router`: flags and process entry."""

from __future__ import annotations

import argparse
import logging

from switchyard.common import endpoints, heap
from switchyard.common.argtypes import seconds
from switchyard.common.engines.tls import add_engine_tls_arguments, engine_tls_from_args
from switchyard.common.flow import config as flow_config
from switchyard.common.logs import add_logging_arguments, setup_logging
from switchyard.common.metrics import add_metrics_arguments
from switchyard.common.ports import add_port_arguments, write_ready_file
from switchyard.common.runner import run_service
from switchyard.router import config as routing_config
from switchyard.router.core import DEFAULT_DISAGG_MIN_UNCACHED_TOKENS, RouterCore
from switchyard.router.kv.ingestor import ListenerSpec
from switchyard.router.kv.listener import DEFAULT_TOPIC_PATTERN
from switchyard.router.load import InFlightTracker
from switchyard.router.service import RouterService
from switchyard.router.timing import TimeParams

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bind",
        type=endpoints.zmq_endpoint,
        default=endpoints.ROUTER,
        help="ZMQ endpoint to serve on (port 0: a free one, see --ready-file)",
    )
    endpoints.add_fleet_arguments(parser)
    parser.add_argument(
        "--router-mode",
        choices=routing_config.MODES,
        default="kv",
        help="routing preset (default %(default)s: predicted time to first token with "
        "session affinity); --routing-config overrides parts of it",
    )
    parser.add_argument(
        "--routing-config",
        default=None,
        help="YAML or JSON file: profiles of filters, weighted scorers and a picker, time "
        "model and bookings (docs/routing.md)",
    )
    group = parser.add_argument_group("time model")
    defaults = TimeParams()
    group.add_argument(
        "--prefill-ms-per-1k-tokens",
        type=float,
        default=defaults.prefill_ms_per_1k_tokens,
        help="prior prefill speed until learned from observed TTFT (default %(default)s)",
    )
    group.add_argument(
        "--ttft-base-ms",
        type=float,
        default=defaults.base_ms,
        help="prior fixed cost of a first token (default %(default)s)",
    )
    group.add_argument(
        "--work-weight",
        type=float,
        default=defaults.work_weight,
        help="weight of the prefill work a choice adds to a worker (default %(default)s)",
    )
    group.add_argument(
        "--decode-ms-per-1k-tokens",
        type=float,
        default=defaults.decode_ms_per_1k_tokens,
        help="what 1k tokens of KV in flight on a worker cost a request joining them "
        "(default %(default)s; 0 ignores the decode batch)",
    )
    group.add_argument(
        "--output-tokens",
        type=int,
        default=defaults.output_tokens,
        help="tokens each request in flight is assumed to add to its worker's KV "
        "(default %(default)s)",
    )
    group.add_argument(
        "--offload-weight",
        type=float,
        default=defaults.offload_weight,
        help="share of a block's prefill an offloaded-tier (CPU/disk) hit saves "
        "(default %(default)s)",
    )
    group.add_argument(
        "--no-learn-prefill-speed",
        action="store_true",
        help="keep the prior speeds instead of learning them from observed TTFT",
    )
    parser.add_argument(
        "--booking-ttl",
        type=float,
        default=10.0,
        help="seconds a routed prompt's blocks count as pending on its worker before the "
        "engine's events confirm them (0: no bookings; default %(default)s)",
    )
    kv = parser.add_argument_group("KV events")
    kv.add_argument(
        "--kv-events-bind",
        type=endpoints.zmq_endpoint,
        default=None,
        help="bind SUB sockets here (rank r at port + r) for engines whose publisher "
        "connects to the router, e.g. tcp://*:5557 (port 0: a free one, reported as "
        "kv_events_listen in --ready-file)",
    )
    kv.add_argument(
        "--kv-events-proxy",
        type=endpoints.zmq_endpoint,
        default=None,
        help="connect SUB sockets to a `switchyard kv-proxy` backend (rank r at port + r); "
        "how several router replicas all get events from engines that connect",
    )
    kv.add_argument(
        "--kv-topic-pattern",
        default=DEFAULT_TOPIC_PATTERN,
        help="the topic each engine publishes under, from {host} {port} {model} "
        "{instance_id} {url} of its worker entry (default %(default)s)",
    )
    kv.add_argument(
        "--kv-silence-warning",
        type=seconds,
        default=30.0,
        help="warn about an engine routed to for this long whose KV events never arrived "
        "(default %(default)s s)",
    )
    kv.add_argument(
        "--kv-stale-after",
        type=seconds,
        default=30.0,
        help="suspect a worker's KV index stale (a WARNING, switchyard_router_kv_suspected_"
        "stale) when no KV event came this long after a request was routed there while "
        "requests still run there (0: never; default %(default)s s)",
    )
    parser.add_argument(
        "--load-poll-interval",
        type=seconds,
        default=0.5,
        help="seconds between GetLoads polls of each engine when a plugin reads engine load "
        "(0: never poll; default %(default)s)",
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
    parser.add_argument(
        "--flow-config",
        default=None,
        metavar="PATH",
        help="flow control: run the deployment's admission gate with this YAML or JSON file "
        "(priorities, fair shares, TTFT objectives; give the preprocessors the same file; "
        "docs/flow-control.md); default: none",
    )
    add_engine_tls_arguments(parser)  # SubscribeKvEvents and GetLoads over grpcs://
    add_metrics_arguments(parser, "router")
    add_port_arguments(parser)
    add_logging_arguments(parser)


def routing_from_args(args: argparse.Namespace) -> routing_config.RoutingConfig:
    time = TimeParams(
        prefill_ms_per_1k_tokens=args.prefill_ms_per_1k_tokens,
        base_ms=args.ttft_base_ms,
        work_weight=args.work_weight,
        decode_ms_per_1k_tokens=args.decode_ms_per_1k_tokens,
        output_tokens=args.output_tokens,
        offload_weight=args.offload_weight,
        learn=not args.no_learn_prefill_speed,
    )
    if args.routing_config:
        return routing_config.load(args.routing_config, args.router_mode)
    return routing_config.preset(args.router_mode, time, args.booking_ttl)


def listener_from_args(args: argparse.Namespace) -> ListenerSpec | None:
    if args.kv_events_bind and args.kv_events_proxy:
        raise ValueError("give --kv-events-bind or --kv-events-proxy, not both")
    if args.kv_events_bind:
        return ListenerSpec("bind", args.kv_events_bind, args.kv_topic_pattern)
    if args.kv_events_proxy:
        return ListenerSpec("connect", args.kv_events_proxy, args.kv_topic_pattern)
    return None


def run(args: argparse.Namespace) -> int:
    logs = setup_logging("router", args.log_level, args.log_format)
    try:
        listener = listener_from_args(args)
        tls = engine_tls_from_args(args)
        flow = flow_config.load(args.flow_config) if args.flow_config else None
        core = RouterCore(
            routing_from_args(args),
            tracker=InFlightTracker(args.request_ttl),
            disagg_min_uncached_tokens=args.disagg_min_uncached_tokens,
        )
    except (OSError, ValueError) as exc:
        log.error("router: %s", exc)
        return 2

    def build() -> RouterService:
        return RouterService(
            core,
            args.bind,
            args.fleet_control,
            args.fleet_events,
            listener=listener,
            load_poll_interval=args.load_poll_interval,
            silence_after=args.kv_silence_warning,
            stale_after=args.kv_stale_after,
            tls=tls,
            flow=flow,
        )

    def bound(service: RouterService, endpoint: str, metrics_port: int | None) -> None:
        logs.instance = endpoint
        report: dict[str, object] = {"bind": endpoint, "metrics_port": metrics_port}
        if service.kv_listen_endpoint is not None:  # --kv-events-bind / --kv-events-proxy
            report["kv_events_listen"] = service.kv_listen_endpoint
        heap.settle()  # the start-up heap, out of full collections
        write_ready_file(args.ready_file, report)

    failed = run_service(build, bound, args)
    if failed is not None:
        log.error("router cannot start: %s", failed)
        return 1
    return 0
