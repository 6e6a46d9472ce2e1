"""The deployment files in deploy/, checked without a Docker engine.

Every container command must be a real `switchyard` invocation (parsed by the CLI's own
argparse parser), every endpoint a client dials must name a service of the same stack that binds
that port, services must bind on all interfaces, the Dockerfile must COPY only paths that exist,
and the compose file must stay scalable (no container_name, one published port). When the
`docker compose` plugin is installed, `docker compose config` validates the files as well (it
needs no daemon).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from switchyard.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
DISPATCHERS_OVERRIDE = DEPLOY / "docker-compose.dispatchers.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"  # BuildKit's per-Dockerfile ignore file
K8S = DEPLOY / "k8s" / "switchyard.yaml"

SWITCHYARD_SERVICES = ("fleet", "router", "dispatcher", "preprocessor")
ANY_HOST = {"*", "0.0.0.0"}


# ---------------------------------------------------------------- loading


def load_compose(*paths: Path) -> dict[str, Any]:
    """The compose files merged the way compose merges these ones: a service's keys from a later
    file replace the earlier ones (lists such as `command` are replaced whole), except the
    `depends_on` mapping, which merges."""
    services: dict[str, dict[str, Any]] = {}
    for path in paths:
        document = yaml.safe_load(path.read_text())
        for name, service in document["services"].items():
            merged = dict(services.get(name, {}))
            for key, value in service.items():
                if key == "depends_on" and isinstance(value, dict):
                    merged[key] = {**merged.get(key, {}), **value}
                else:
                    merged[key] = value
            services[name] = merged
    return services


COMPOSE_STACKS = {
    "compose": (COMPOSE,),
    "compose+dispatchers": (COMPOSE, DISPATCHERS_OVERRIDE),
}


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def parse_command(parser: argparse.ArgumentParser, where: str, argv: Any) -> argparse.Namespace:
    assert isinstance(argv, list) and argv, f"{where}: command must be a non-empty list"
    assert all(isinstance(item, str) for item in argv), (
        f"{where}: every command item must be a string (quote ports): {argv!r}"
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: `switchyard {' '.join(argv)}` does not parse (exit {exc.code})")
    assert args.command != "up", f"{where}: `switchyard up` is the single-host launcher"
    return args


# ---------------------------------------------------------------- endpoints


@dataclass
class Wiring:
    """What one container binds ((kind, port) pairs) and dials ((flag, kind, url) triples).
    A kind names what the socket serves (fleet-control, fleet-events, router, dispatcher, grpc,
    http), so a client pointed at the right host but the wrong one of its ports is caught."""

    binds: set[tuple[str, int]] = field(default_factory=set)
    dials: list[tuple[str, str, str]] = field(default_factory=list)


def _zmq_bind(where: str, kind: str, flag: str, endpoint: str, wiring: Wiring) -> None:
    parts = urlsplit(endpoint)
    assert parts.scheme == "tcp" and parts.port, (
        f"{where}: {flag} {endpoint} is not tcp://host:port"
    )
    assert parts.hostname in ANY_HOST, (
        f"{where}: {flag} {endpoint} must bind tcp://*:PORT or tcp://0.0.0.0:PORT in a container"
    )
    wiring.binds.add((kind, parts.port))


def _host_bind(where: str, kind: str, host: str, port: int, wiring: Wiring) -> None:
    assert host == "0.0.0.0", f"{where}: --host {host} is unreachable from other containers"
    assert port > 0, f"{where}: a fixed --port is needed for others to dial it"
    wiring.binds.add((kind, port))


def wiring_of(where: str, args: argparse.Namespace) -> Wiring:
    wiring = Wiring()
    fleet_dials = [
        ("--fleet-control", "fleet-control", getattr(args, "fleet_control", None)),
        ("--fleet-events", "fleet-events", getattr(args, "fleet_events", None)),
    ]
    if args.command == "fleet":
        _zmq_bind(where, "fleet-control", "--control", args.control, wiring)
        _zmq_bind(where, "fleet-events", "--events", args.events, wiring)
        assert args.worker or args.workers_file, f"{where}: fleet needs --worker or --workers-file"
        # A worker's kv_events/kv_replay options name the engine's own sockets, which the
        # mock engines do not have (they stream KV events over gRPC): not checked here.
        wiring.dials += [("--worker", "grpc", spec.url) for spec in args.worker]
        wiring.dials += [("--prefill", "grpc", url) for url in args.prefill]
    elif args.command in ("router", "dispatcher"):
        _zmq_bind(where, args.command, "--bind", args.bind, wiring)
        wiring.dials += fleet_dials
    elif args.command == "preprocessor":
        _host_bind(where, "http", args.host, args.port, wiring)
        assert args.dispatcher, f"{where}: give --dispatcher explicitly (the default is loopback)"
        assert args.router, f"{where}: give --router explicitly (the default is loopback)"
        wiring.dials += [("--router", "router", endpoint) for endpoint in args.router]
        wiring.dials += [("--dispatcher", "dispatcher", endpoint) for endpoint in args.dispatcher]
        wiring.dials += fleet_dials
    elif args.command == "mock-engine":
        _host_bind(where, "grpc", args.host, args.port, wiring)
    else:  # pragma: no cover - a new subcommand needs a rule here
        pytest.fail(f"{where}: no wiring rule for subcommand {args.command!r}")
    return wiring


def check_wiring(stack: str, commands: dict[str, argparse.Namespace]) -> None:
    """Every endpoint a container dials names a service of the stack binding that port."""
    wirings = {name: wiring_of(f"{stack}/{name}", args) for name, args in commands.items()}
    for name, wiring in wirings.items():
        for flag, kind, url in wiring.dials:
            parts = urlsplit(url)
            scheme = "grpc" if kind == "grpc" else "tcp"
            where = f"{stack}/{name}: {flag} {url}"
            assert parts.scheme == scheme and parts.hostname and parts.port, (
                f"{where}: expected {scheme}://<service>:<port>"
            )
            assert parts.hostname in wirings, (
                f"{where}: {parts.hostname!r} is not a service of this stack "
                f"({', '.join(sorted(wirings))})"
            )
            assert (kind, parts.port) in wirings[parts.hostname].binds, (
                f"{where}: {parts.hostname} binds {sorted(wirings[parts.hostname].binds)}, "
                f"not a {kind} endpoint on port {parts.port}"
            )


# ---------------------------------------------------------------- compose


@pytest.mark.parametrize("stack", sorted(COMPOSE_STACKS))
def test_compose_commands_parse_and_wire_up(stack: str, parser: argparse.ArgumentParser) -> None:
    services = load_compose(*COMPOSE_STACKS[stack])
    commands = {
        name: parse_command(parser, f"{stack}/{name}", service.get("command"))
        for name, service in services.items()
    }
    subcommands = sorted(args.command for args in commands.values())
    for required in SWITCHYARD_SERVICES:
        assert required in subcommands, f"{stack}: no {required} service"
    assert subcommands.count("fleet") == 1, f"{stack}: run exactly one fleet (see README)"
    protocols = sorted(a.protocol for a in commands.values() if a.command == "mock-engine")
    assert protocols == ["sglang", "vllm"], f"{stack}: mock engines {protocols}"
    check_wiring(stack, commands)


@pytest.mark.parametrize("stack", sorted(COMPOSE_STACKS))
def test_compose_one_image_for_every_service(stack: str) -> None:
    services = load_compose(*COMPOSE_STACKS[stack])
    images = {
        name: (s.get("image"), json.dumps(s.get("build"), sort_keys=True))
        for name, s in services.items()
    }
    assert len(set(images.values())) == 1, f"{stack}: services differ in image/build: {images}"
    build = next(iter(services.values()))["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == ROOT, f"build context {context} is not the repo root"
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE


@pytest.mark.parametrize("stack", sorted(COMPOSE_STACKS))
def test_compose_services_scale(stack: str) -> None:
    services = load_compose(*COMPOSE_STACKS[stack])
    for name, service in services.items():
        assert "container_name" not in service, f"{stack}/{name}: container_name blocks --scale"
        if name != "preprocessor":
            assert "ports" not in service, f"{stack}/{name}: only the preprocessor publishes ports"


def _healthcheck_code(where: str, service: dict[str, Any]) -> str:
    check = service.get("healthcheck")
    assert check, f"{where}: no healthcheck"
    test = check["test"]
    assert test[:3] == ["CMD", "python", "-c"] and len(test) == 4, (
        f"{where}: healthcheck must be [CMD, python, -c, code] (slim images lack curl): {test}"
    )
    code = test[3]
    compile(code, f"<{where} healthcheck>", "exec")  # a typo would make it fail forever
    return code


def test_compose_preprocessor_publishes_and_is_checked(parser: argparse.ArgumentParser) -> None:
    service = load_compose(COMPOSE)["preprocessor"]
    args = parse_command(parser, "preprocessor", service["command"])
    ports = service.get("ports")
    assert ports, "preprocessor publishes no port"
    for mapping in ports:
        container_port = str(mapping).rsplit(":", 1)[-1].split("/")[0]
        assert container_port == str(args.port), f"{mapping} does not target --port {args.port}"
    code = _healthcheck_code("preprocessor", service)
    assert f"127.0.0.1:{args.port}/ready" in code, f"healthcheck does not GET /ready: {code}"


def test_compose_healthchecks_probe_the_bound_port(parser: argparse.ArgumentParser) -> None:
    for name, service in load_compose(COMPOSE, DISPATCHERS_OVERRIDE).items():
        args = parse_command(parser, name, service["command"])
        if args.command == "preprocessor":
            continue
        code = _healthcheck_code(name, service)
        ports = {port for _, port in wiring_of(name, args).binds}
        assert any(f"127.0.0.1', {port})" in code for port in ports), (
            f"{name}: healthcheck {code!r} connects to none of its ports {sorted(ports)}"
        )


def _compose_cli() -> tuple[list[str] | None, str]:
    docker = shutil.which("docker")
    reason = "no `docker` client on PATH"
    if docker:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=60
        )
        if probe.returncode == 0:
            return [docker, "compose"], ""
        output = (probe.stderr or probe.stdout).strip().splitlines() or ["no output"]
        reason = f"`docker compose version` failed: {output[0]}"
    standalone = shutil.which("docker-compose")
    if standalone:
        return [standalone], ""
    return None, f"the docker compose plugin is not installed ({reason})"


@pytest.mark.parametrize("stack", sorted(COMPOSE_STACKS))
def test_docker_compose_config_accepts_the_files(stack: str) -> None:
    cli, reason = _compose_cli()
    if cli is None:
        pytest.skip(reason)
    files = [arg for path in COMPOSE_STACKS[stack] for arg in ("-f", str(path))]
    result = subprocess.run(
        [*cli, *files, "config", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"docker compose config ({stack}): {result.stderr}"


# ---------------------------------------------------------------- Dockerfile


def dockerfile_instructions() -> list[tuple[str, str]]:
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return instructions


def copy_sources() -> list[str]:
    sources: list[str] = []
    for keyword, rest in dockerfile_instructions():
        if keyword != "COPY":
            continue
        parts = json.loads(rest) if rest.startswith("[") else rest.split()
        parts = [part for part in parts if not part.startswith("--")]
        assert len(parts) >= 2, f"COPY {rest}: needs a source and a destination"
        sources += parts[:-1]
    return sources


def test_dockerfile_base_user_and_entrypoint() -> None:
    instructions = dockerfile_instructions()
    froms = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert froms and froms[0].split()[0] == "python:3.11-slim"
    entrypoints = [rest for keyword, rest in instructions if keyword == "ENTRYPOINT"]
    assert entrypoints, "no ENTRYPOINT"
    assert json.loads(entrypoints[-1]) == ["switchyard"]
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the image must not run as root"
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert "pip install --no-cache-dir ." in runs


def test_dockerfile_copies_existing_paths_and_everything_the_build_needs() -> None:
    sources = [source.rstrip("/").removeprefix("./") for source in copy_sources()]
    assert sources, "the Dockerfile COPYs nothing"
    for source in sources:
        assert source not in ("", "."), "COPY the needed folders, not the whole context"
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repo"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml"}
    needed |= {path.split("/")[0] for path in project["tool"]["setuptools"]["package-dir"].values()}
    readme = project["project"].get("readme")
    if isinstance(readme, str):
        needed.add(readme)
    missing = needed - set(sources)
    assert not missing, f"pip install . needs {sorted(missing)}, which the Dockerfile does not COPY"


def test_dockerignore_lets_every_copy_source_through() -> None:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*", "the ignore file is an allowlist: `*` first"
    allowed = {pattern[1:].rstrip("/") for pattern in patterns if pattern.startswith("!")}
    for source in copy_sources():
        name = source.rstrip("/").removeprefix("./")
        assert name in allowed, f"COPY {source} would be ignored: add !{name}"


# ---------------------------------------------------------------- Kubernetes


def test_k8s_manifests_parse_and_wire_up(parser: argparse.ArgumentParser) -> None:
    documents = [doc for doc in yaml.safe_load_all(K8S.read_text()) if doc]
    deployments = [doc for doc in documents if doc["kind"] == "Deployment"]
    k8s_services = [doc for doc in documents if doc["kind"] == "Service"]
    image = load_compose(COMPOSE)["fleet"]["image"]
    commands: dict[str, argparse.Namespace] = {}
    for service in k8s_services:
        name = service["metadata"]["name"]
        selector = service["spec"]["selector"]
        matches = [
            d
            for d in deployments
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matches) == 1, f"k8s Service {name} selects {len(matches)} Deployments"
        (container,) = matches[0]["spec"]["template"]["spec"]["containers"]
        assert container["image"] == image, f"k8s {name}: image {container['image']}"
        assert "command" not in container, f"k8s {name}: keep the image's switchyard entrypoint"
        args = commands[name] = parse_command(parser, f"k8s/{name}", container["args"])
        bound = {port for _, port in wiring_of(f"k8s/{name}", args).binds}
        for port in service["spec"]["ports"]:
            assert port["port"] == port["targetPort"] and port["targetPort"] in bound, (
                f"k8s Service {name} port {port} is not a port its pods bind {sorted(bound)}"
            )
    assert len(deployments) == len(k8s_services), "one Service per Deployment"
    assert {args.command for args in commands.values()} >= set(SWITCHYARD_SERVICES)
    fleets = [d for d in deployments if d["metadata"]["name"] == "fleet"]
    assert fleets and fleets[0]["spec"]["replicas"] == 1, "run exactly one fleet"
    check_wiring("k8s", commands)
