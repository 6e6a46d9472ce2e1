"""Session fixtures of the real-engine suite: four real vLLM engines, shared by every test.

- `grpc_a`: gRPC mode, KV events on its own ZMQ publisher (`tcp://*:P`, with replay);
- `grpc_b`: gRPC mode, no ZMQ publisher: the router follows its SubscribeKvEvents stream;
- `http_c`: vLLM's own OpenAI HTTP server (`vllm serve` without --grpc), for side-by-side
  answers. Same model, same build, same flags (and its parsers, for the parser tests);
- `grpc_e`: gRPC mode, the same model as an embedding model (`--runner pooling --convert
  embed`, served as `tiny-embed`).

They start side by side (~4 GB each at their peak; the session peaks at ~16 GB) and every
engine process is stopped at the end of the session, also when a test or a start fails.
`stack` is `switchyard up` in front of the two gRPC engines. Tests that kill an engine
(test_zz_faults.py) run last and restart it.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import engine_venv as venv  # noqa: E402
import engines  # noqa: E402
from e2e_stack import Stack, running_stack  # noqa: E402

from switchyard.common.workers import worker_flag  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (a CI job cancelled) as Ctrl-C: pytest then runs the session's teardown, which
    # stops the engines (~4 GB each) instead of leaving them behind.
    signal.signal(signal.SIGTERM, signal.default_int_handler)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return venv.python_of(venv.ensure())


@pytest.fixture(scope="session")
def model(vllm_python: Path) -> Path:
    return engines.model_dir(vllm_python)


class EngineSet:
    def __init__(self, python: Path, model: Path) -> None:
        self.python, self.model = python, model
        self.all: dict[str, engines.Engine] = {}

    def start(self, name: str, **kwargs: object) -> engines.Engine:
        engine = engines.start(name, self.python, self.model, **kwargs)  # type: ignore[arg-type]
        self.all[name] = engine
        return engine

    def restart(self, name: str) -> engines.Engine:
        engine = self.all[name]
        engine.restart()
        return engine

    def stop(self, keep_logs: bool) -> None:
        for engine in self.all.values():
            engine.stop()
            if not keep_logs:
                engine.remove_logs()


@pytest.fixture(scope="session")
def engine_set(
    request: pytest.FixtureRequest, vllm_python: Path, model: Path
) -> Iterator[EngineSet]:
    found = EngineSet(vllm_python, model)
    keep_logs = True  # a start that failed, or an interrupted session
    try:
        found.start("a", grpc_mode=True, kv_events=True)
        found.start("b", grpc_mode=True)
        # vLLM's server takes a named tool_choice only with auto tool choice and a tool
        # parser (they act only on requests that carry tools). Its deepseek_v3 reasoning
        # parser splits only requests that switch thinking on (chat_template_kwargs), the
        # others are answered as without it; `enable_in_reasoning` keeps a structured
        # output's grammar on from the first token, as on the gRPC engines (no parser).
        found.start(
            "c",
            grpc_mode=False,
            extra_args=(
                "--enable-auto-tool-choice",
                "--tool-call-parser",
                "deepseek_v3",
                "--reasoning-parser",
                "deepseek_v3",
                "--structured-outputs-config",
                '{"enable_in_reasoning": true}',
            ),
        )
        # The same model as an embedding model (vLLM's pooling runner, its default pooler
        # for a converted model), for /v1/embeddings over the servicer's Embed.
        found.start(
            "e",
            grpc_mode=True,
            extra_args=("--runner", "pooling", "--convert", "embed"),
            served_name=engines.EMBED_MODEL,
        )
        with ThreadPoolExecutor(len(found.all)) as pool:
            for done in [pool.submit(e.wait_ready) for e in found.all.values()]:
                done.result()
        yield found
        keep_logs = request.session.testsfailed > 0
    finally:
        # The engines' logs (in the temp folder) stay for a look when something failed.
        found.stop(keep_logs)


@pytest.fixture(scope="session")
def grpc_a(engine_set: EngineSet) -> engines.Engine:
    return engine_set.all["a"]


@pytest.fixture(scope="session")
def grpc_b(engine_set: EngineSet) -> engines.Engine:
    return engine_set.all["b"]


@pytest.fixture(scope="session")
def grpc_e(engine_set: EngineSet) -> engines.Engine:
    return engine_set.all["e"]


@pytest.fixture(scope="session")
def http_c(engine_set: EngineSet) -> engines.Engine:
    return engine_set.all["c"]


def worker_of(engine: engines.Engine) -> str:
    return worker_flag(engine.url, kv_events=engine.kv_events, kv_replay=engine.kv_replay)


@pytest.fixture(scope="session")
def stack(engine_set: EngineSet) -> Iterator[Stack]:
    a, b = engine_set.all["a"], engine_set.all["b"]
    with running_stack(
        "--worker", worker_of(a), "--worker", b.url, "--metrics", timeout=300
    ) as running:
        yield running


@pytest.fixture(scope="session")
def sy(stack: Stack) -> Iterator[openai.OpenAI]:
    """The openai SDK on Switchyard."""
    with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="none", max_retries=0) as c:
        yield c


@pytest.fixture(scope="session")
def vl(http_c: engines.Engine) -> Iterator[openai.OpenAI]:
    """The openai SDK on vLLM's own OpenAI server."""
    with openai.OpenAI(base_url=http_c.url + "/v1", api_key="none", max_retries=0) as c:
        yield c
