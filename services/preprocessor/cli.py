"""`switchyard preprocessor`: flags and process entry (uvicorn on uvloop + httptools)."""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Callable

import uvicorn

from switchyard.common import endpoints, heap
from switchyard.common.argtypes import positive_seconds, whole_number
from switchyard.common.engines.tls import add_engine_tls_arguments, engine_tls_from_args
from switchyard.common.flow import config as flow_config
from switchyard.common.logs import add_logging_arguments, setup_logging
from switchyard.common.metrics import add_metrics_arguments, serve_metrics
from switchyard.common.ports import add_port_arguments, bind_tcp, port_number, write_ready_file
from switchyard.common.replicas import RESOLVE_INTERVAL_S
from switchyard.preprocessor import admission, cors, https
from switchyard.preprocessor.app import create_app
from switchyard.preprocessor.auth import ADMIN_TOKEN_ENV, KEYS_ENV, Access, KeyRing, keys_from_env
from switchyard.preprocessor.edge import Edge
from switchyard.preprocessor.listener import adopt, open_listener
from switchyard.preprocessor.parsers.registry import reasoning_format, tool_parser_class
from switchyard.preprocessor.serving import GracefulServer
from switchyard.preprocessor.state import PreprocessorConfig, PreprocessorState
from switchyard.preprocessor.storage.config import add_store_arguments, store_config_from_args
from switchyard.preprocessor.tokenizer import OFFLOAD_CHARS, TOKENIZER_FILE
from switchyard.preprocessor.tokenizer_source import parse_tokenizer_flags

log = logging.getLogger("switchyard.preprocessor")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_guardrail_arguments(parser: argparse.ArgumentParser) -> None:
    """Keys, admission limits, deadlines, shutdown (also `switchyard up`'s)."""
    auth = parser.add_argument_group(
        "access (/health is always open)",
        "/v1 routes need a client key when any is configured; /ready, /metrics, /debug and "
        "/admin need the admin token on the API port, or the admin listener",
    )
    auth.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help=f"a client key (repeatable; visible in ps: prefer {KEYS_ENV}, comma-separated, "
        "or --api-keys-file); default: none, the API is open",
    )
    auth.add_argument(
        "--api-keys-file",
        default=None,
        metavar="PATH",
        help="client keys, one per line (# comments), re-read within a second of a change; "
        "turns authentication on even while empty",
    )
    auth.add_argument(
        "--admin-token",
        default=None,
        metavar="TOKEN",
        help=f"Bearer token for /ready, /metrics, /debug and /admin on the API port (or "
        f"{ADMIN_TOKEN_ENV}); default: none",
    )
    auth.add_argument(
        "--admin-host",
        default="127.0.0.1",
        help="the admin listener's host (default 127.0.0.1: loopback only)",
    )
    auth.add_argument(
        "--admin-port",
        type=port_number,
        default=None,
        help="serve /health, /ready, /metrics, /debug and /admin without a token on this port "
        "(0: a free one, see --ready-file); default: no admin listener",
    )
    limits = parser.add_argument_group(
        "admission and deadlines", "beyond the limits a request gets 429 with Retry-After"
    )
    limits.add_argument(
        "--max-concurrent-requests",
        type=whole_number(0),
        default=admission.DEFAULT_MAX_CONCURRENT,
        metavar="N",
        help="generation requests this process runs at once (0: no limit; default "
        f"{admission.DEFAULT_MAX_CONCURRENT})",
    )
    limits.add_argument(
        "--max-queued-requests",
        type=whole_number(0),
        default=admission.DEFAULT_MAX_QUEUED,
        metavar="N",
        help="requests that may wait for a slot; more get 429 at once (default "
        f"{admission.DEFAULT_MAX_QUEUED})",
    )
    limits.add_argument(
        "--queue-timeout",
        type=positive_seconds,
        default=admission.DEFAULT_QUEUE_TIMEOUT,
        metavar="SECONDS",
        help="a queued request waits this long for a slot, then gets 429 (default "
        f"{admission.DEFAULT_QUEUE_TIMEOUT:g})",
    )
    limits.add_argument(
        "--max-requests-per-key",
        type=whole_number(0),
        default=0,
        metavar="N",
        help="requests one client key may have running or queued (0: no limit; default 0)",
    )
    limits.add_argument(
        "--flow-config",
        default=None,
        metavar="PATH",
        help="flow control: priorities, fair shares between tenants, TTFT objectives, and "
        "limits for the whole deployment, from this YAML or JSON file, enforced by the "
        "routers' gate (give them the same file; docs/flow-control.md); default: none",
    )
    limits.add_argument(
        "--request-timeout",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="a request's total deadline, queueing included; past it its engine requests are "
        "aborted and the client gets 504 (an error event once streaming). A client may ask "
        "for less with the request-timeout-ms header. 0: none (default 0)",
    )
    limits.add_argument(
        "--shutdown-grace",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM: stop accepting, let running requests finish this long, then end "
        "them with an error (default 30)",
    )


def add_edge_arguments(parser: argparse.ArgumentParser) -> None:
    """HTTPS and CORS at the API listener (also `switchyard up`'s)."""
    group = parser.add_argument_group(
        "HTTPS and CORS (both off by default)",
        "TLS files are re-read when they change; CORS answers browsers' preflights",
    )
    https.add_arguments(group)
    cors.add_arguments(group)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default=endpoints.HTTP_HOST, help="address the HTTP API listens on"
    )
    parser.add_argument(
        "--port",
        type=port_number,
        default=endpoints.HTTP_PORT,
        help="HTTP port (0: a free one of --port-range, see --ready-file)",
    )
    parser.add_argument(
        "--router",
        type=endpoints.zmq_endpoint,
        action="append",
        default=None,
        help=f"router ZMQ endpoint (repeat for replicas; default {endpoints.ROUTER})",
    )
    parser.add_argument(
        "--dispatcher",
        type=endpoints.zmq_endpoint,
        action="append",
        default=None,
        help=f"dispatcher ZMQ endpoint (repeat for replicas; default {endpoints.DISPATCHER})",
    )
    parser.add_argument(
        "--resolve-interval",
        type=positive_seconds,
        default=RESOLVE_INTERVAL_S,
        help="seconds between lookups of the router and dispatcher names: every address a "
        "name resolves to is a replica (a compose service scaled with --scale, a Kubernetes "
        "headless Service); also looked up again when a connection drops",
    )
    endpoints.add_fleet_arguments(parser)
    parser.add_argument(
        "--tokenizer",
        action="append",
        type=_tokenizer_value,
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
        "--engine-streaming",
        choices=("auto", "always"),
        default="auto",
        help="auto (default): a request the client does not stream is asked of the engine "
        "whole, one final message (as smg and vLLM's own server do: no per-token cost), "
        "unless it has stop strings or a prefill hop; a fault restarts it from the prompt. "
        "always: every engine request streams, so the gap timeout watches it and a "
        "migration keeps its tokens",
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
        type=whole_number(1),
        default=32 * 1024 * 1024,
        help="larger generation requests get 413 (default 32 MiB)",
    )
    parser.add_argument(
        "--keep-alive-timeout",
        type=positive_seconds,
        default=75.0,
        help="seconds an idle client connection is kept open (default 75, as nginx): longer "
        "than clients' own pool expiry (httpx: 5 s), so the client closes first and never "
        "sends a request on a connection the server is closing (ECONNRESET)",
    )
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="bind with SO_REUSEPORT, so several preprocessor processes share --port "
        "(the kernel spreads connections over them); listens once ready (at most 60 s on). "
        "Each has its own accept queue: prefer --listen-fd (what `switchyard up` does)",
    )
    parser.add_argument(
        "--listen-fd",
        type=whole_number(0),
        default=None,
        metavar="FD",
        help="serve on this inherited, already listening TCP socket instead of binding "
        "--host/--port (what `switchyard up` gives each replica: its socket of one "
        "SO_REUSEPORT group, held by up); with --standby-fd, accepts once ready",
    )
    parser.add_argument(
        "--standby-fd",
        type=whole_number(0),
        action="append",
        default=[],
        metavar="FD",
        help="a sibling replica's inherited listening socket (repeatable): connections "
        "waiting in its queue longer than 50 ms (the sibling dead, restarting, frozen or "
        "busy) are accepted and served here; this one then accepts only once ready (at "
        "most 60 s on), leaving its own queue to the siblings meanwhile",
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
    add_guardrail_arguments(parser)
    add_edge_arguments(parser)
    add_store_arguments(parser)
    add_engine_tls_arguments(parser)  # GetTokenizer over grpcs://
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
    try:
        engine_tls = engine_tls_from_args(args)
        tls = https.from_args(args)
        limits = admission.Limits(
            args.max_concurrent_requests,
            args.max_queued_requests,
            args.queue_timeout,
            args.max_requests_per_key,
        )
        flow = flow_config.load(args.flow_config) if args.flow_config else None
        try:
            keys = KeyRing([*args.api_key, *keys_from_env()], args.api_keys_file)
        except (OSError, UnicodeDecodeError) as exc:
            raise SystemExit(f"preprocessor: --api-keys-file {args.api_keys_file}: {exc}") from None
        access = Access(
            keys,
            args.admin_token or os.environ.get(ADMIN_TOKEN_ENV) or None,
            args.admin_port,
        )
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"preprocessor: {exc}") from None
    # Bound first (uvicorn listens on it once the app started): port 0 is searched in
    # --port-range and reported, so no other process ever picks the number for us; and the
    # URL names this process in its logs and traces. Or inherited, listening already.
    try:
        sock = open_listener(
            args.host,
            args.port,
            args.port_range,
            reuse_port=args.reuse_port,
            listen_fd=args.listen_fd,
        )
        standby = [adopt(fd) for fd in args.standby_fd]
    except ValueError as exc:
        raise SystemExit(f"preprocessor: {exc}") from None
    except OSError as exc:
        raise SystemExit(f"preprocessor: cannot bind {args.host}:{args.port}: {exc}") from None
    host, port = sock.getsockname()[:2]
    if args.listen_fd is None:
        host = args.host
    scheme = "https" if tls is not None else "http"
    logs.instance = instance = f"{scheme}://{host}:{port}"
    # Sharing the port with other processes: listen / accept once ready, so that the kernel
    # (and the siblings' standby) hands connections only to processes that can serve them. A
    # lone one serves at once (/ready says 503 until it is ready; /admin answers).
    shared = args.reuse_port or bool(args.standby_fd)
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
            engine_streaming=args.engine_streaming,
            stage_timing=args.stage_timing,
            dispatcher_wait=args.dispatcher_wait,
            resolve_interval=args.resolve_interval,
            migration_limit=args.migration_limit,
            tokenize_offload_chars=args.tokenize_offload_chars,
            listen_when_ready_s=READY_WAIT_S if shared else 0.0,
            access_log=not args.no_access_log,
            otlp_endpoint=args.otlp_endpoint,
            trace_sample_ratio=args.trace_sample_ratio,
            instance=instance,
            engine_tls=engine_tls,
            request_timeout=args.request_timeout,
            admission=limits,
            flow=flow,
            shutdown_grace=args.shutdown_grace,
            store=store_config_from_args(args),
        )
    except ValueError as exc:
        raise SystemExit(f"preprocessor: {exc}") from None
    state = PreprocessorState(config, access=access)
    try:
        metrics_port = serve_metrics(
            state.metrics.registry, args.metrics_host, args.metrics_port, args.port_range
        )
    except OSError as exc:
        raise SystemExit(
            f"preprocessor: cannot serve /metrics on {args.metrics_host}:{args.metrics_port}: {exc}"
        ) from None
    edge = Edge(
        create_app(state),
        state.deps,
        args.max_body_bytes,
        state.access_log,
        access,
        state.admission,
        args.request_timeout,
    )
    try:
        app = cors.wrap(edge, args)
    except ValueError as exc:
        raise SystemExit(f"preprocessor: {exc}") from None
    if tls is not None:
        state.watches.append(("tls-files", tls.watch))
    server = GracefulServer(
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
            ssl_context_factory=(lambda _config, _default: tls.context) if tls else None,
        ),
        state,
        args.shutdown_grace,
        standby,
    )
    sockets = [sock]
    admin_port = None
    if args.admin_port is not None:
        try:
            admin_sock = bind_tcp(args.admin_host, args.admin_port, args.port_range)
        except OSError as exc:
            raise SystemExit(
                f"preprocessor: cannot bind the admin listener {args.admin_host}:"
                f"{args.admin_port}: {exc}"
            ) from None
        admin_port = int(admin_sock.getsockname()[1])
        access.admin_port = admin_port
        if tls is not None:  # the operator's loopback listener stays plain HTTP
            server.plain_sockets.append(admin_sock)
        else:
            sockets.append(admin_sock)
        if args.admin_host not in ("127.0.0.1", "::1", "localhost"):
            log.warning(
                "the admin listener on %s:%d serves /admin and /metrics without a token: "
                "keep it off untrusted networks",
                args.admin_host,
                admin_port,
            )
    for warning in access.warnings(f"{args.host}:{port}"):
        log.warning("%s", warning)
    heap.settle()  # imports and the app, out of full collections (tokenizers: when loaded)
    write_ready_file(
        args.ready_file, {"port": port, "metrics_port": metrics_port, "admin_port": admin_port}
    )
    server.run(sockets=sockets)
    return 0


READY_WAIT_S = 60.0


def _tokenizer_value(text: str) -> str:
    """argparse type of --tokenizer: a MODEL=DIR with a half missing is a usage error (exit
    2, like any other malformed flag), not a folder that has no tokenizer.json."""
    try:
        parse_tokenizer_flags([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _parser_flags(values: list[str], check: Callable[[str], object]) -> dict[str, str]:
    """`[MODEL=]NAME` values -> {model or "": name}, each name checked now (fail at start)."""
    out: dict[str, str] = {}
    for value in values:
        model, sep, name = value.rpartition("=")
        key = model if sep else ""
        check(name)
        out[key] = name
    return out
