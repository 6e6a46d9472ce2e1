"""`switchyard up`: the whole local stack as child processes of one command.

Mock engines (when asked), fleet, router(s), dispatcher(s) and the preprocessor, wired over
free loopback ports. A child that crashes is restarted (see supervisor); Ctrl-C or SIGTERM
stops every child.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
import urllib.error
import urllib.request

from switchyard.common import endpoints
from switchyard.common.logs import setup_logging
from switchyard.common.ports import free_port
from switchyard.supervisor import ChildSpec, Supervisor

log = logging.getLogger("switchyard.up")

PROTOCOLS = ("sglang", "vllm")


def _protocol_list(text: str) -> list[str]:
    items = [p.strip() for p in text.split(",") if p.strip()]
    for item in items:
        if item not in PROTOCOLS:
            raise argparse.ArgumentTypeError(f"{item!r} is not one of {', '.join(PROTOCOLS)}")
    return items


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mock-engines",
        type=_protocol_list,
        default=[],
        help="comma-separated protocols of mock engines to start, e.g. sglang,vllm",
    )
    parser.add_argument(
        "--mock-prefill",
        type=_protocol_list,
        default=[],
        help="protocols of prefill-role mock engines to start (listed with --prefill), "
        "e.g. sglang,vllm",
    )
    parser.add_argument(
        "--mock-decode",
        type=_protocol_list,
        default=[],
        help="protocols of decode-role mock engines to start (they only decode transferred KV)",
    )
    parser.add_argument(
        "--worker",
        action="append",
        default=[],
        help="engine URL grpc://host:port (repeatable), in addition to mocks",
    )
    parser.add_argument("--workers-file", default=None)
    parser.add_argument("--prefill", action="append", default=[])
    parser.add_argument("--http-host", default=endpoints.HTTP_HOST)
    parser.add_argument("--http-port", type=int, default=endpoints.HTTP_PORT)
    parser.add_argument("--router-mode", default="kv")
    parser.add_argument("--dispatchers", type=_count, default=1, help="dispatcher replicas")
    parser.add_argument("--routers", type=_count, default=1, help="router replicas")
    parser.add_argument(
        "--preprocessors",
        type=_count,
        default=1,
        help="preprocessor processes sharing --http-port (SO_REUSEPORT; one per spare core)",
    )
    parser.add_argument(
        "--no-restart",
        action="store_true",
        help="stop the whole stack when any child exits (default: restart it)",
    )
    parser.add_argument(
        "--tokenizer",
        action="append",
        default=[],
        metavar="[MODEL=]DIR",
        help="tokenizer folder for the preprocessor: DIR for every model, MODEL=DIR for one "
        "(repeat; default: each model's from its engines)",
    )
    parser.add_argument("--mock-ttft-ms", type=float, default=20.0)
    parser.add_argument("--mock-itl-ms", type=float, default=5.0)
    parser.add_argument("--mock-speedup", type=float, default=1.0)
    parser.add_argument("--model-name", default="deepseek-mock")
    parser.add_argument(
        "--mock-arg",
        action="append",
        default=[],
        help="extra flag passed to every mock engine (repeat; e.g. "
        "--mock-arg=--prefill-ms-per-token=0.2)",
    )
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        help="extra flag passed to every router (repeat; e.g. "
        "--router-arg=--disagg-min-uncached-tokens=512)",
    )
    parser.add_argument(
        "--preprocessor-arg",
        action="append",
        default=[],
        help="extra flag passed to every preprocessor (repeat; e.g. "
        "--preprocessor-arg=--stream-idle-timeout=30)",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="serve Prometheus /metrics from fleet, routers, dispatchers and each preprocessor "
        "on free ports (logged); GET /metrics on the HTTP port answers for whichever "
        "preprocessor takes the connection",
    )
    parser.add_argument(
        "--router-metrics-port",
        type=int,
        default=None,
        help="serve the router's Prometheus metrics on this port",
    )
    parser.add_argument("--log-level", default="INFO")


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_stack(args: argparse.Namespace) -> tuple[list[ChildSpec], list[str]]:
    """The child processes to start, and the engine URLs they serve."""
    py = [sys.executable, "-m", "switchyard"]
    log_level = ["--log-level", args.log_level]
    specs: list[ChildSpec] = []
    workers = list(args.worker)
    prefill = list(args.prefill)
    mocks = [(p, None) for p in args.mock_engines]
    mocks += [(p, "prefill") for p in getattr(args, "mock_prefill", [])]
    mocks += [(p, "decode") for p in getattr(args, "mock_decode", [])]
    for index, (protocol, role) in enumerate(mocks):
        port = free_port()
        events = f"tcp://127.0.0.1:{free_port()}"
        replay = f"tcp://127.0.0.1:{free_port()}"
        # The operator's per-worker options tell fleet where each engine publishes KV events
        # (vLLM engines do not advertise it; SGLang ones do, and this agrees).
        workers.append(f"grpc://127.0.0.1:{port}?kv_events={events}&kv_replay={replay}")
        engine = ["mock-engine", "--protocol", protocol, "--port", str(port)]
        if role is not None:
            engine += ["--role", role]
        if role == "prefill":
            prefill.append(f"grpc://127.0.0.1:{port}")
            if protocol == "sglang":
                engine += ["--bootstrap-port", "0"]
        engine += ["--model-name", args.model_name, "--speedup", str(args.mock_speedup)]
        engine += ["--ttft-ms", str(args.mock_ttft_ms), "--itl-ms", str(args.mock_itl_ms)]
        # The engine binds a wildcard endpoint (the engines' rule; a named host connects).
        wildcard = events.replace("127.0.0.1", "*")
        engine += ["--kv-events-endpoint", wildcard, "--kv-replay-endpoint", replay]
        name = f"mock-engine-{index}-{protocol}" + (f"-{role}" if role else "")
        specs.append(ChildSpec(name, py + engine + args.mock_arg + log_level))
    if not workers and not args.workers_file:
        raise SystemExit(
            "switchyard up: give --mock-engines / --mock-prefill / --mock-decode, --worker or "
            "--workers-file"
        )
    fleet_control = f"tcp://127.0.0.1:{free_port()}"
    fleet_events = f"tcp://127.0.0.1:{free_port()}"
    routers = [f"tcp://127.0.0.1:{free_port()}" for _ in range(args.routers)]
    dispatchers = [f"tcp://127.0.0.1:{free_port()}" for _ in range(args.dispatchers)]
    fleet_flags = ["--fleet-control", fleet_control, "--fleet-events", fleet_events]
    fleet_cmd = py + ["fleet", "--control", fleet_control, "--events", fleet_events, *log_level]
    for url in workers:
        fleet_cmd += ["--worker", url]
    for url in prefill:
        fleet_cmd += ["--prefill", url]
    if args.workers_file:
        fleet_cmd += ["--workers-file", args.workers_file]
    if args.metrics:
        fleet_cmd += _metrics_flags("fleet")
    specs.append(ChildSpec("fleet", fleet_cmd))
    for index, endpoint in enumerate(routers):
        router_cmd = py + ["router", "--bind", endpoint, "--router-mode", args.router_mode]
        router_cmd += fleet_flags + log_level + args.router_arg
        if args.router_metrics_port is not None and index == 0:
            router_cmd += ["--metrics-port", str(args.router_metrics_port)]
        elif args.metrics:
            router_cmd += _metrics_flags(f"router-{index}")
        specs.append(ChildSpec(f"router-{index}", router_cmd))
    for index, endpoint in enumerate(dispatchers):
        dispatcher_cmd = py + ["dispatcher", "--bind", endpoint, *fleet_flags, *log_level]
        if args.metrics:
            dispatcher_cmd += _metrics_flags(f"dispatcher-{index}")
        specs.append(ChildSpec(f"dispatcher-{index}", dispatcher_cmd))
    pre = py + ["preprocessor", "--host", args.http_host, "--port", str(args.http_port)]
    pre += fleet_flags + log_level
    for endpoint in routers:
        pre += ["--router", endpoint]
    for endpoint in dispatchers:
        pre += ["--dispatcher", endpoint]
    for tokenizer in args.tokenizer:
        pre += ["--tokenizer", tokenizer]
    pre += args.preprocessor_arg
    count = args.preprocessors
    for index in range(count):
        name = "preprocessor" if count == 1 else f"preprocessor-{index}"
        cmd = pre + (["--reuse-port"] if count > 1 else [])
        if args.metrics:
            cmd += _metrics_flags(name)
        specs.append(ChildSpec(name, cmd))
    return specs, workers


def _metrics_flags(name: str) -> list[str]:
    port = free_port()
    log.info("%s metrics on http://127.0.0.1:%d/metrics", name, port)
    return ["--metrics-port", str(port)]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def run(args: argparse.Namespace) -> int:
    setup_logging("up", args.log_level)
    specs, workers = build_stack(args)
    supervisor = Supervisor(restart=not args.no_restart)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    base = f"http://{args.http_host}:{args.http_port}"
    announced = False
    code = 0
    try:
        for spec in specs:
            supervisor.start(spec)
        while not stopping:
            failed = supervisor.poll()
            if failed is not None:
                log.error("%s keeps failing; stopping the stack", failed)
                code = 1
                break
            if not announced and _ready(base + "/ready"):
                announced = True
                log.info(
                    "Switchyard is serving the OpenAI API on %s/v1 (engines: %s)",
                    base,
                    ", ".join(workers) or args.workers_file,
                )
            time.sleep(0.2)
    finally:
        supervisor.stop_all()
    return code
