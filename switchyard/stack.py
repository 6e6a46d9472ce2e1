"""`switchyard up`: the whole local stack as child processes of one command.

Mock engines (when asked), fleet, router(s), dispatcher(s) and the preprocessor(s), wired over
loopback (the routers and dispatchers on Unix sockets, ipc://). Started in stages (engines,
fleet, routers and dispatchers, preprocessors), each child binds its own ports (port 0: a free
one of --port-range) and reports them in a ready file, which the next stage is given: no port
is picked by one process and bound by another. The HTTP port is bound by `up` itself, one
listening socket per preprocessor (one SO_REUSEPORT group: the kernel spreads new connections
evenly), held for the stack's lifetime; each preprocessor accepts from its own (--listen-fd)
once it is ready, and from its siblings' (--standby-fd) what they leave waiting. A preprocessor
that dies loses only the connections it had accepted: its socket and queue stay, the others
take what waits there, and its restart inherits it again. A child that crashes is restarted on
the ports it had (see supervisor).

Ctrl-C or SIGTERM stops the stack in dependency order (the children run in their own process
groups, so a terminal's Ctrl-C reaches `up` alone): the preprocessors first, which stop
accepting and let their running requests finish (--shutdown-grace), then the routers and
dispatchers, then fleet, then the mock engines. No stream is cut for want of a dispatcher.

Client keys (--api-key, SWITCHYARD_API_KEYS) reach the preprocessors in their environment,
never on a command line. With any key or admin token configured, each preprocessor also gets
an admin listener on loopback (unless --admin-port says where), which `up` polls for /ready.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard.common import endpoints
from switchyard.common.argtypes import positive_seconds, seconds, whole_number
from switchyard.common.engines.tls import (
    add_engine_tls_arguments,
    engine_tls_argv,
    engine_tls_from_args,
)
from switchyard.common.flow import config as flow_config
from switchyard.common.logs import add_logging_arguments, setup_logging
from switchyard.common.ports import (
    PortRange,
    add_port_arguments,
    port_number,
    read_ready_file,
    wildcard_endpoint,
    write_ready_file,
)
from switchyard.common.workers import worker_flag
from switchyard.dispatcher.channels import DEFAULT_DRAIN_TIMEOUT
from switchyard.dispatcher.service import ENGINE_STREAMS, ENGINE_STREAMS_HTTP2
from switchyard.live_set import LiveSet
from switchyard.preprocessor import cors, https
from switchyard.preprocessor.auth import ADMIN_TOKEN_ENV, KEYS_ENV, keys_from_env
from switchyard.preprocessor.cli import add_edge_arguments, add_guardrail_arguments
from switchyard.preprocessor.listener import listen_group
from switchyard.preprocessor.serving import BACKSTOP_S
from switchyard.preprocessor.storage.config import DSN_ENV, add_store_arguments, store_argv
from switchyard.router.config import MODES
from switchyard.supervisor import ChildSpec, SignalWait, Supervisor, signal_wait

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
    parser.add_argument(
        "--workers-file",
        default=None,
        metavar="PATH",
        help="YAML or JSON list of engines for fleet (watched for edits)",
    )
    parser.add_argument(
        "--prefill",
        action="append",
        default=[],
        metavar="URL",
        help="treat this engine URL as prefill when the engine does not say (repeatable)",
    )
    parser.add_argument(
        "--http-host", default=endpoints.HTTP_HOST, help="address the OpenAI API listens on"
    )
    parser.add_argument(
        "--http-port",
        type=port_number,
        default=endpoints.HTTP_PORT,
        help="HTTP port of the OpenAI API (0: a free one of --port-range, logged)",
    )
    parser.add_argument(
        "--router-mode", choices=MODES, default="kv", help="the routers' policy (router --help)"
    )
    parser.add_argument(
        "--dispatchers", type=whole_number(1), default=1, help="dispatcher replicas"
    )
    parser.add_argument("--routers", type=whole_number(1), default=1, help="router replicas")
    parser.add_argument(
        "--preprocessors",
        type=whole_number(1),
        default=1,
        help="preprocessor processes sharing --http-port (one per spare core); each has its "
        "own listening socket held by `up`, and takes over a dead or stalled one's queue",
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
    parser.add_argument(
        "--mock-ttft-ms", type=float, default=20.0, help="mock engines' fixed prefill cost"
    )
    parser.add_argument(
        "--mock-itl-ms", type=float, default=5.0, help="mock engines' time per decode step"
    )
    parser.add_argument(
        "--mock-speedup", type=float, default=1.0, help="mock engines divide every delay by this"
    )
    parser.add_argument(
        "--model-name", default="deepseek-mock", help="the model name mock engines serve"
    )
    parser.add_argument(
        "--mock-arg",
        action="append",
        default=[],
        help="extra flag passed to every mock engine (repeat; e.g. "
        "--mock-arg=--prefill-ms-per-token=0.2)",
    )
    parser.add_argument(
        "--fleet-arg",
        action="append",
        default=[],
        help="extra flag passed to fleet (repeat; e.g. --fleet-arg=--down-after=5)",
    )
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        help="extra flag passed to every router (repeat; e.g. "
        "--router-arg=--disagg-min-uncached-tokens=512)",
    )
    parser.add_argument(
        "--dispatcher-arg",
        action="append",
        default=[],
        help="extra flag passed to every dispatcher (repeat; e.g. "
        "--dispatcher-arg=--reply-window-ms=0)",
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
        help="the default, kept for older command lines: fleet, routers, dispatchers and each "
        "preprocessor serve Prometheus /metrics on free ports (logged, and in --ready-file); "
        "GET /metrics on the HTTP port answers for whichever preprocessor takes the connection",
    )
    parser.add_argument(
        "--no-metrics",
        action="store_true",
        help="serve no /metrics ports (the preprocessors' GET /metrics on the HTTP port stays)",
    )
    parser.add_argument(
        "--router-metrics-port",
        type=port_number,
        default=None,
        help="serve the router's Prometheus metrics on this port",
    )
    parser.add_argument(
        "--drain-timeout",
        type=seconds,
        default=DEFAULT_DRAIN_TIMEOUT,
        metavar="SECONDS",
        help="the dispatchers': streams of an engine that left the routable set (removed, "
        f"drained, down) may finish this long, then migrate (default {DEFAULT_DRAIN_TIMEOUT:g})",
    )
    parser.add_argument(
        "--engine-streams",
        choices=ENGINE_STREAMS,
        default=ENGINE_STREAMS_HTTP2,
        help="the dispatchers': how Generate streams reach the engines (http2: the event "
        "loop's own HTTP/2 connection; grpc: a grpc.aio channel; default "
        f"{ENGINE_STREAMS_HTTP2})",
    )
    add_guardrail_arguments(parser)  # passed to every preprocessor (--shutdown-grace: too)
    add_edge_arguments(parser)  # HTTPS and CORS: passed to every preprocessor
    add_store_arguments(parser)  # passed to every preprocessor (the DSN in their environment)
    add_engine_tls_arguments(parser)  # passed to fleet, routers, dispatchers, preprocessors
    # --port-range for every child; --ready-file for up itself, written when a client can use
    # the stack (a bound socket that routes nowhere yet would not do)
    add_port_arguments(
        parser, "once the stack serves (its /ready answers 200), again after a child restarts"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where fleet keeps its state file (fleet-state.sqlite: the admin API's added "
        "workers and drain marks, the instance set it publishes), restored when fleet "
        "restarts; default: a folder of this run (it survives a fleet restart, not `up`'s): "
        "give one to keep admin changes across runs",
    )
    parser.add_argument(
        "--start-timeout",
        type=positive_seconds,
        default=120.0,
        help="seconds each start-up stage may take to report its ports",
    )
    add_logging_arguments(parser)


LOCAL = "tcp://127.0.0.1:0"  # a free loopback port, searched by the child itself


def local_socket(folder: Path, name: str) -> str:
    """Where a router or dispatcher of this host binds: a Unix socket in `up`'s own folder.
    The per-token and per-request hops cost less CPU over ipc:// than over loopback TCP (no
    TCP stack, no conntrack; docs/benchmarks.md, "ipc:// between the services of `up`"). A
    restart binds the same path (libzmq unlinks a socket file left behind). Services on
    separate hosts (compose, Kubernetes) keep tcp://. A folder too deep for a Unix socket's
    path (108 bytes) gets a loopback port instead."""
    path = f"{folder / name}.sock"
    return f"ipc://{path}" if len(os.fsencode(path)) < 100 else LOCAL


FLEET_STATE = "fleet-state.sqlite"


class StackFailed(RuntimeError):
    """A child could not start (exited, or did not report its ports in time)."""


@dataclass
class Stack:
    """What `up` started: child name -> its ready report, the engines, the HTTP base URL."""

    base_url: str
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    workers: list[str] = field(default_factory=list)
    ready_url: str = ""  # where `up` asks for /ready (the API port, or an admin listener)


# Stop order (highest first) and how long each kind may take to stop.
ENGINES, FLEET, MIDDLE, INGRESS = range(4)
STOP_GRACE_S = 10.0


def preprocessor_guardrail_argv(args: argparse.Namespace, admin_listener: bool) -> list[str]:
    """The preprocessor flags `up` passes on (keys travel in the environment instead)."""
    out = [
        "--max-concurrent-requests", str(args.max_concurrent_requests),
        "--max-queued-requests", str(args.max_queued_requests),
        "--queue-timeout", str(args.queue_timeout),
        "--max-requests-per-key", str(args.max_requests_per_key),
        "--request-timeout", str(args.request_timeout),
        "--shutdown-grace", str(args.shutdown_grace),
    ]  # fmt: skip
    if args.api_keys_file:
        out += ["--api-keys-file", str(args.api_keys_file)]
    if args.flow_config:
        out += ["--flow-config", os.path.abspath(args.flow_config)]
    if admin_listener:
        out += ["--admin-host", args.admin_host]
    return out + https.argv(args) + cors.argv(args)


def child_env(args: argparse.Namespace) -> dict[str, str] | None:
    """The preprocessors' environment: `up`'s, plus the client keys, the admin token and the
    PostgreSQL DSN (secrets stay off command lines)."""
    keys = [*args.api_key, *keys_from_env()]
    token = args.admin_token or os.environ.get(ADMIN_TOKEN_ENV)
    dsn = args.postgres_dsn
    if not keys and not token and not dsn:
        return None
    env = dict(os.environ)
    if keys:
        env[KEYS_ENV] = ",".join(keys)
    if token:
        env[ADMIN_TOKEN_ENV] = token
    if dsn:
        env[DSN_ENV] = dsn
    return env


def wants_admin_listener(args: argparse.Namespace) -> bool:
    """Any key or token configured, or HTTPS: /ready is no longer open (or plain) on the API
    port, so `up` polls it on an admin listener (loopback, plain HTTP, a free port, unless
    --admin-port says otherwise)."""
    secured = bool(
        args.api_key
        or keys_from_env()
        or args.api_keys_file
        or args.admin_token
        or os.environ.get(ADMIN_TOKEN_ENV)
        or args.tls_cert
    )
    return secured or args.admin_port is not None


class Launcher:
    """Starts the stack stage by stage on a Supervisor, reading each child's ready file, and
    re-specs every child with the ports it bound (a restart binds them again)."""

    def __init__(self, args: argparse.Namespace, supervisor: Supervisor, folder: Path) -> None:
        self.args = args
        self.supervisor = supervisor
        self.folder = folder
        self.py = [sys.executable, "-m", "switchyard"]
        self.common = ["--log-level", args.log_level, "--log-format", args.log_format]
        if getattr(args, "config", None):  # every child reads its own section of the file
            self.common += ["--config", str(args.config)]
        if args.port_range is not None:
            self.common += ["--port-range", str(args.port_range)]

    def stage(
        self,
        children: list[tuple[str, Callable[[dict[str, Any] | None], list[str]]]],
        order: int = ENGINES,
        stop_grace: float = STOP_GRACE_S,
        env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> dict[str, dict[str, Any]]:
        """Start children at once, wait for every report; `argv(report)` builds a child's
        command line, with report None first (ports 0) and then with what it bound."""
        started = []
        for name, argv in children:
            ready = self.folder / f"{name}.json"
            ready.unlink(missing_ok=True)
            flags = [*self.common, "--ready-file", str(ready)]
            spec = ChildSpec(name, self.py + argv(None) + flags, env, order, stop_grace, pass_fds)
            started.append((name, argv, ready, self.supervisor.start(spec)))
        reports = {}
        for name, argv, ready, proc in started:
            try:
                report = read_ready_file(ready, proc, self.args.start_timeout)
            except RuntimeError as exc:
                raise StackFailed(f"{name} {exc}") from None
            reports[name] = report
            final = self.py + argv(report) + self.common + ["--ready-file", str(ready)]
            self.supervisor.respec(name, final, env)
            if report.get("metrics_port"):
                log.info("%s metrics on http://127.0.0.1:%d/metrics", name, report["metrics_port"])
        return reports

    def _metrics(self, report: dict[str, Any] | None) -> list[str]:
        if self.args.no_metrics:
            return ["--metrics-port", "off"]
        # Free ports: several routers or dispatchers on one host cannot share a default one.
        return ["--metrics-port", str(report["metrics_port"] if report else 0)]

    def start(self, http: list[socket.socket]) -> Stack:
        """Start every child; preprocessor i serves http[i] (listening sockets of one port)
        and stands by for the others."""
        args = self.args
        http_port = int(http[0].getsockname()[1])
        stack = Stack(f"http://{args.http_host}:{http_port}")
        workers = list(args.worker)
        prefill = list(args.prefill)
        mocks: list[tuple[str, str | None]] = [(p, None) for p in args.mock_engines]
        mocks += [(p, "prefill") for p in getattr(args, "mock_prefill", [])]
        mocks += [(p, "decode") for p in getattr(args, "mock_decode", [])]
        engines = []
        for index, (protocol, role) in enumerate(mocks):
            name = f"mock-engine-{index}-{protocol}" + (f"-{role}" if role else "")
            engines.append((name, self._engine_argv(protocol, role)))
        stack.reports.update(self.stage(engines, ENGINES))
        for (name, _), (_, role) in zip(engines, mocks, strict=True):
            r = stack.reports[name]
            # The operator's per-worker options tell fleet where each engine publishes KV
            # events (vLLM engines do not advertise it; SGLang ones do, and this agrees).
            url = f"grpc://127.0.0.1:{r['port']}"
            workers.append(worker_flag(url, kv_events=r["kv_events"], kv_replay=r["kv_replay"]))
            if role == "prefill":
                prefill.append(url)
        if not workers and not args.workers_file:
            raise SystemExit(
                "switchyard up: give --mock-engines / --mock-prefill / --mock-decode, --worker "
                "or --workers-file"
            )
        stack.workers = workers

        tls = engine_tls_argv(args)

        def fleet(report: dict[str, Any] | None) -> list[str]:
            control = report["control"] if report else LOCAL
            events = report["events"] if report else LOCAL
            cmd = ["fleet", "--control", control, "--events", events, *tls]
            for url in workers:
                cmd += ["--worker", url]
            for url in prefill:
                cmd += ["--prefill", url]
            if args.workers_file:
                cmd += ["--workers-file", args.workers_file]
            state = (args.state_dir or self.folder) / FLEET_STATE
            cmd += ["--state-file", str(state), *self._metrics(report)]
            return cmd + args.fleet_arg  # last: the operator's flags win

        fleet_report = self.stage([("fleet", fleet)], FLEET)["fleet"]
        stack.reports["fleet"] = fleet_report
        fleet_flags = ["--fleet-control", fleet_report["control"]]
        fleet_flags += ["--fleet-events", fleet_report["events"]]

        def router(index: int) -> Callable[[dict[str, Any] | None], list[str]]:
            def argv(report: dict[str, Any] | None) -> list[str]:
                bind = report["bind"] if report else local_socket(self.folder, f"router-{index}")
                cmd = ["router", "--bind", bind]
                cmd += ["--router-mode", args.router_mode, *fleet_flags, *tls, *args.router_arg]
                if args.flow_config:  # the deployment's flow gate (the same file)
                    cmd += ["--flow-config", os.path.abspath(args.flow_config)]
                if args.router_metrics_port is not None and index == 0:
                    return cmd + ["--metrics-port", str(args.router_metrics_port)]
                return cmd + self._metrics(report)

            return argv

        def dispatcher(index: int) -> Callable[[dict[str, Any] | None], list[str]]:
            def argv(report: dict[str, Any] | None) -> list[str]:
                bind = (
                    report["bind"] if report else local_socket(self.folder, f"dispatcher-{index}")
                )
                cmd = ["dispatcher", "--bind", bind, *fleet_flags]
                cmd += ["--drain-timeout", str(args.drain_timeout), *tls]
                cmd += ["--shutdown-grace", str(args.shutdown_grace)]
                cmd += ["--engine-streams", args.engine_streams]
                return cmd + self._metrics(report) + args.dispatcher_arg

            return argv

        middle = [(f"router-{i}", router(i)) for i in range(args.routers)]
        middle += [(f"dispatcher-{i}", dispatcher(i)) for i in range(args.dispatchers)]
        stack.reports.update(self.stage(middle, MIDDLE, args.shutdown_grace + STOP_GRACE_S))
        count = args.preprocessors
        # Preprocessor i (and each restart of it) accepts from http[i] once it is ready, and
        # stands by for the others' sockets.
        pre = ["preprocessor", "--host", args.http_host]
        pre += fleet_flags
        for i in range(args.routers):
            pre += ["--router", stack.reports[f"router-{i}"]["bind"]]
        for i in range(args.dispatchers):
            pre += ["--dispatcher", stack.reports[f"dispatcher-{i}"]["bind"]]
        for tokenizer in args.tokenizer:
            pre += ["--tokenizer", tokenizer]
        admin = wants_admin_listener(args)
        if admin and args.admin_port and count > 1:
            raise SystemExit("switchyard up: --admin-port with several preprocessors: use 0")
        pre += preprocessor_guardrail_argv(args, admin) + store_argv(args)
        pre += tls + args.preprocessor_arg

        def preprocessor(index: int) -> Callable[[dict[str, Any] | None], list[str]]:
            def argv(report: dict[str, Any] | None) -> list[str]:
                cmd = pre + ["--listen-fd", str(http[index].fileno())]
                for other, sock in enumerate(http):
                    if other != index:
                        cmd += ["--standby-fd", str(sock.fileno())]
                if admin:
                    bound = report["admin_port"] if report else (args.admin_port or 0)
                    cmd += ["--admin-port", str(bound)]
                return cmd + self._metrics(report)

            return argv

        names = ["preprocessor"] if count == 1 else [f"preprocessor-{i}" for i in range(count)]
        grace = args.shutdown_grace + BACKSTOP_S + STOP_GRACE_S
        children: list[tuple[str, Callable[[dict[str, Any] | None], list[str]]]] = [
            (name, preprocessor(i)) for i, name in enumerate(names)
        ]
        fds = tuple(sock.fileno() for sock in http)
        stack.reports.update(self.stage(children, INGRESS, grace, child_env(args), fds))
        port = stack.reports[names[0]]["port"]
        scheme = "https" if args.tls_cert else "http"
        stack.base_url = f"{scheme}://{args.http_host}:{port}"
        stack.ready_url = stack.base_url + "/ready"
        if admin:
            host = "127.0.0.1" if args.admin_host in ("0.0.0.0", "::", "") else args.admin_host
            first = stack.reports[names[0]]["admin_port"]
            stack.ready_url = f"http://{host}:{first}/ready"
            log.info(
                "admin listener(s) on %s",
                ", ".join(f"http://{host}:{stack.reports[n]['admin_port']}" for n in names),
            )
        log.info("preprocessors started: the API will be on %s/v1", stack.base_url)
        return stack

    def _engine_argv(
        self, protocol: str, role: str | None
    ) -> Callable[[dict[str, Any] | None], list[str]]:
        args = self.args

        def argv(report: dict[str, Any] | None) -> list[str]:
            port = str(report["port"]) if report else "0"
            # a restart binds the ports it bound (a named host would make the publisher connect)
            events = wildcard_endpoint(report["kv_events"]) if report else LOCAL
            replay = report["kv_replay"] if report else LOCAL
            cmd = ["mock-engine", "--protocol", protocol, "--port", port]
            if role is not None:
                cmd += ["--role", role]
            if role == "prefill" and protocol == "sglang":
                cmd += ["--bootstrap-port", "0"]
            cmd += ["--model-name", args.model_name, "--speedup", str(args.mock_speedup)]
            cmd += ["--ttft-ms", str(args.mock_ttft_ms), "--itl-ms", str(args.mock_itl_ms)]
            cmd += ["--kv-events-endpoint", events, "--kv-replay-endpoint", replay]
            return cmd + args.mock_arg

        return argv


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _report(path: Path | None, stack: Stack, supervisor: Supervisor) -> None:
    """up's own ready file: the HTTP base URL, engines, every child's ports and pid."""
    pids = {name: supervisor.pid(name) for name in supervisor.children}
    write_ready_file(
        path,
        {
            "base_url": stack.base_url,
            "workers": stack.workers,
            "children": stack.reports,
            "pids": pids,
        },
    )


def stop(supervisor: Supervisor, http: list[socket.socket]) -> None:
    """Stop the stack (twice is harmless). The listeners are closed first: once the
    preprocessors stop accepting, new connections are refused rather than queued for nobody."""
    for sock in http:
        sock.close()
    supervisor.stop_all()


def _serve(
    args: argparse.Namespace,
    supervisor: Supervisor,
    folder: Path,
    http: list[socket.socket],
    wake: SignalWait,
    stopping: Callable[[], bool],
) -> int:
    """Start the stack, announce it once it serves, supervise it until a stop signal (0) or
    a child keeps failing (1)."""
    try:
        stack = Launcher(args, supervisor, folder).start(http)
    except StackFailed as exc:
        log.error("the stack did not start: %s", exc)
        return 1
    live: LiveSet | None = None  # the engines fleet has routable, logged as they change
    restarts = supervisor.restarts
    try:
        while not stopping():
            failed = supervisor.poll()
            if failed is not None:
                log.error("%s keeps failing; stopping the stack", failed)
                return 1
            if live is None and _ready(stack.ready_url):
                fleet = stack.reports["fleet"]
                live = LiveSet(fleet["control"], fleet["events"])
                log.info(
                    "Switchyard is serving the OpenAI API on %s/v1 (engines: %s)",
                    stack.base_url,
                    live.start() or ", ".join(stack.workers) or args.workers_file,
                )
                _report(args.ready_file, stack, supervisor)
            elif live is not None and supervisor.restarts != restarts:
                restarts = supervisor.restarts
                _report(args.ready_file, stack, supervisor)  # new pids
            if live is None:
                wake.wait(0.2)  # until the stack answers /ready
            else:  # until a child exits, a restart is due, or a stop signal
                due = supervisor.next_restart_at()
                wake.wait(None if due is None else max(0.0, due - time.monotonic()))
        return 0
    finally:
        if live is not None:
            live.stop()


def run(args: argparse.Namespace) -> int:
    setup_logging("up", args.log_level, args.log_format)
    try:
        engine_tls_from_args(args)  # unreadable files fail here, not in every child
        https.from_args(args)
        cors.wrap(None, args)
        if args.flow_config:
            flow_config.load(args.flow_config)  # a bad file fails here, not in every child
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    supervisor = Supervisor(restart=not args.no_restart)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    ports: PortRange | None = args.port_range
    try:
        # Held for the stack's lifetime: a preprocessor's queue outlives it, for its siblings
        # and its restart to serve.
        http = listen_group(args.http_host, args.http_port, args.preprocessors, ports)
    except OSError as exc:
        log.error("cannot bind the HTTP port %s:%d: %s", args.http_host, args.http_port, exc)
        return 1
    code = 1
    try:
        with tempfile.TemporaryDirectory(prefix="switchyard-up-") as folder, signal_wait() as wake:
            try:
                code = _serve(args, supervisor, Path(folder), http, wake, lambda: stopping)
            finally:  # in the folder's lifetime: fleet may write its state there until it stops
                stop(supervisor, http)
    finally:
        stop(supervisor, http)
    return code
