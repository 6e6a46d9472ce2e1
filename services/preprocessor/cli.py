"""`switchyard preprocessor`: flags and process entry (uvicorn on uvloop + httptools)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import uvicorn

from switchyard.common import endpoints
from switchyard.common.logs import add_logging_arguments, setup_logging
from switchyard.common.metrics import add_metrics_arguments, serve_metrics
from switchyard.common.ports import add_port_arguments, bind_tcp, write_ready_file
from switchyard.preprocessor.app import create_app
from switchyard.preprocessor.edge import Edge
from switchyard.preprocessor.parsers.registry import reasoning_format, tool_parser_class
from switchyard.preprocessor.state import PreprocessorConfig, PreprocessorState
from switchyard.preprocessor.tokenizer import OFFLOAD_CHARS, TOKENIZER_FILE
from switchyard.preprocessor.tokenizer_source import parse_tokenizer_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default=endpoints.HTTP_HOST, help="address the HTTP API listens on"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=endpoints.HTTP_PORT,
        help="HTTP port (0: a free one of --port-range, see --ready-file)",
    )
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
        help=f"dispatcher ZMQ endpoint (repeat for replicas; default {endpoints.DISPATCHER})",
    )
    endpoints.add_fleet_arguments(parser)
    parser.add_argument(
        "--tokenizer",
        action="append",
        default=[],
        metavar="[MODEL=]DIR",
        help="tokenizer folder: DIR for every model, MODEL=DIR for one (repeat); "
        "default: each model's from one of its engines (GetTokenizer)",
    )
    parser.add_argument(
        "--tool-call-parser",
        action="append",
        default=[],
        metavar="[MODEL=]NAME",
        help="how a model's tool calls are read from its output: deepseek_v3, deepseek_r1, "
        "deepseek_v31, hermes (qwen25, qwen3), llama3_json, llama4_json, mistral, kimi_k2, "
        "none; MODEL=NAME for one model (repeat); default: guessed from the model's chat "
        "template and config.json",
    )
    parser.add_argument(
        "--reasoning-parser",
        action="append",
        default=[],
        metavar="[MODEL=]NAME",
        help="how a model's reasoning is split from its answer: deepseek_r1, deepseek_v31, "
        "qwen3, kimi_k2, none; MODEL=NAME for one model (repeat); default: guessed",
    )
    parser.add_argument(
        "--route-timeout",
        type=float,
        default=5.0,
        help="seconds to wait for a router's answer before trying the next router (or the "
        "local round-robin fallback)",
    )
    parser.add_argument(
        "--stream-idle-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for a stream's first token (a long prompt's prefill) before "
        "it counts as failed and migrates",
    )
    parser.add_argument(
        "--stream-gap-timeout",
        type=float,
        default=5.0,
        help="seconds without a token, once tokens flow, after which a stream counts as "
        "failed and migrates (a frozen engine)",
    )
    parser.add_argument(
        "--dispatcher-wait",
        type=float,
        default=30.0,
        help="seconds a stream waits for a dispatcher when none is connected (one restarting)",
    )
    parser.add_argument(
        "--migration-limit",
        type=int,
        default=3,
        help="how many times one request may move to another engine after a fault",
    )
    parser.add_argument(
        "--tokenize-offload-chars",
        type=int,
        default=OFFLOAD_CHARS,
        help="prompts of at least this many characters are tokenized on a worker thread, "
        "off the event loop that streams every other request (0: always)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=32 * 1024 * 1024,
        help="larger generation requests get 413 (default 32 MiB)",
    )
    parser.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=75.0,
        help="seconds an idle client connection is kept open (default 75, as nginx): longer "
        "than clients' own pool expiry (httpx: 5 s), so the client closes first and never "
        "sends a request on a connection the server is closing (ECONNRESET)",
    )
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="bind with SO_REUSEPORT, so several preprocessor processes share --port "
        "(the kernel spreads connections over them); listens once ready (at most 60 s on)",
    )
    parser.add_argument(
        "--no-access-log",
        action="store_true",
        help="write no access line per request (logger switchyard.access, INFO)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        default=None,
        metavar="URL",
        help="turn tracing on: export OpenTelemetry spans over OTLP/gRPC to this collector, "
        "e.g. http://127.0.0.1:4317 (http: plaintext); default: off",
    )
    parser.add_argument(
        "--trace-sample-ratio",
        type=float,
        default=1.0,
        help="with tracing on, the share of requests traced when the client's traceparent "
        "does not decide",
    )
    parser.add_argument(
        "--stage-timing",
        action="store_true",
        help="benchmark mode: time every request stage into "
        "switchyard_preprocessor_stage_seconds{stage}",
    )
    add_metrics_arguments(parser, "preprocessor")  # /metrics is also served on the HTTP port
    add_port_arguments(parser)
    add_logging_arguments(parser)


def run(args: argparse.Namespace) -> int:
    logs = setup_logging("preprocessor", args.log_level, args.log_format)
    try:
        default_dir, per_model = parse_tokenizer_flags(args.tokenizer)
    except ValueError as exc:
        raise SystemExit(f"preprocessor: --tokenizer: {exc}") from None
    for folder in [default_dir, *per_model.values()]:
        if folder is not None and not (folder / TOKENIZER_FILE).is_file():
            raise SystemExit(f"preprocessor: --tokenizer: no {TOKENIZER_FILE} in {folder}")
    try:
        tool_parsers = _parser_flags(args.tool_call_parser, tool_parser_class)
        reasoning_parsers = _parser_flags(args.reasoning_parser, reasoning_format)
    except ValueError as exc:
        raise SystemExit(f"preprocessor: {exc}") from None
    # Bound first (uvicorn listens on it once the app started): port 0 is searched in
    # --port-range and reported, so no other process ever picks the number for us; and the
    # URL names this process in its logs and traces.
    try:
        sock = bind_tcp(args.host, args.port, args.port_range, reuse_port=args.reuse_port)
    except OSError as exc:
        raise SystemExit(f"preprocessor: cannot bind {args.host}:{args.port}: {exc}") from None
    sock.set_inheritable(True)
    port = int(sock.getsockname()[1])
    logs.instance = instance = f"http://{args.host}:{port}"
    try:
        config = PreprocessorConfig(
            tool_parsers=tool_parsers,
            reasoning_parsers=reasoning_parsers,
            routers=args.router or [endpoints.ROUTER],
            dispatchers=args.dispatcher or [endpoints.DISPATCHER],
            fleet_control=args.fleet_control,
            fleet_events=args.fleet_events,
            tokenizer_dir=default_dir,
            tokenizer_dirs=per_model,
            route_timeout=args.route_timeout,
            stream_idle_timeout=args.stream_idle_timeout,
            stream_gap_timeout=args.stream_gap_timeout,
            stage_timing=args.stage_timing,
            dispatcher_wait=args.dispatcher_wait,
            migration_limit=args.migration_limit,
            tokenize_offload_chars=args.tokenize_offload_chars,
            # Sharing the port: listen once ready, so the kernel picks only ready processes.
            listen_when_ready_s=READY_WAIT_S if args.reuse_port else 0.0,
            access_log=not args.no_access_log,
            otlp_endpoint=args.otlp_endpoint,
            trace_sample_ratio=args.trace_sample_ratio,
            instance=instance,
        )
    except ValueError as exc:
        raise SystemExit(f"preprocessor: {exc}") from None
    state = PreprocessorState(config)
    metrics_port = serve_metrics(
        state.metrics.registry, args.metrics_host, args.metrics_port, args.port_range
    )
    app = Edge(create_app(state), state.deps, args.max_body_bytes, state.access_log)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            loop="uvloop",
            http="httptools",
            log_level="warning",
            access_log=False,
            log_config=None,
            timeout_keep_alive=args.keep_alive_timeout,
        )
    )
    write_ready_file(args.ready_file, {"port": port, "metrics_port": metrics_port})
    server.run(sockets=[sock])
    return 0


READY_WAIT_S = 60.0


def _parser_flags(values: list[str], check: Callable[[str], object]) -> dict[str, str]:
    """`[MODEL=]NAME` values -> {model or "": name}, each name checked now (fail at start)."""
    out: dict[str, str] = {}
    for value in values:
        model, sep, name = value.rpartition("=")
        key = model if sep else ""
        check(name)
        out[key] = name
    return out
