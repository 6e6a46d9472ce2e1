"""Helpers for tests that need a mock engine: in-process or as a real subprocess.

async with start_mock_engine(MockEngineConfig(protocol="vllm", port=0, speedup=100)) as e:
    ...  # dial e.target; e.engine.active_requests is the core's live count

async with spawn_mock_engine("sglang", "--speedup", "100") as e:
    ...  # `python -m switchyard.mock_engine` on a free port, healthy; killed on exit

async with kv_subscriber(e.kv_events_endpoint) as sub:   # a SUB socket, connected and settled
    topic, seq, payload = await sub.recv_multipart()
frames = await kv_replay(e.kv_replay_endpoint, start=3)  # every reply up to the end marker
await wait_until(lambda: e.kv_transfers.handed_over == 1)  # poll a condition, with a deadline
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import zmq
import zmq.asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from switchyard.common.ports import free_port, read_ready_file
from switchyard.mock_engine.config import default_tokenizer_dir
from switchyard.mock_engine.server import start_mock_engine

__all__ = [
    "END_SEQ",
    "SpawnedEngine",
    "free_port",
    "kv_replay",
    "kv_subscriber",
    "spawn_mock_engine",
    "start_mock_engine",
    "wait_healthy",
    "wait_until",
]

END_SEQ = b"\xff" * 8  # the replay end marker's sequence field


async def wait_until(
    condition: Callable[[], bool], *, timeout_s: float = 10.0, interval_s: float = 0.01
) -> None:
    """Poll `condition` until it holds; TimeoutError after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() >= deadline:
            raise TimeoutError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)


async def wait_healthy(target: str, *, service: str = "", timeout_s: float = 30.0) -> None:
    """Poll grpc.health.v1 until `service` is SERVING; TimeoutError after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        while True:
            try:
                reply = await stub.Check(request, timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if loop.time() >= deadline:
                raise TimeoutError(f"mock engine at {target} not healthy after {timeout_s}s")
            await asyncio.sleep(0.05)


@dataclasses.dataclass(frozen=True)
class SpawnedEngine:
    process: subprocess.Popen[bytes]
    host: str
    port: int
    report: dict[str, Any] = dataclasses.field(default_factory=dict)  # its --ready-file

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"


@contextlib.asynccontextmanager
async def spawn_mock_engine(
    protocol: str, *args: str, host: str = "127.0.0.1", ready_timeout_s: float = 30.0
) -> AsyncIterator[SpawnedEngine]:
    """Run `python -m switchyard.mock_engine` on a free port until the block exits.

    The engine binds a free port itself and reports it (and its KV endpoints) in a ready file;
    then its health service is awaited. On exit (also on failure) sends SIGTERM, then kills it
    if it has not stopped within 10 s. The process's stderr is inherited.
    """
    with tempfile.TemporaryDirectory(prefix="mock-engine-") as folder:
        ready_file = Path(folder) / "ready.json"
        command = [sys.executable, "-m", "switchyard.mock_engine", "--protocol", protocol]
        command += ["--host", host, "--port", "0", "--ready-file", str(ready_file), *args]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=dict(os.environ))
        try:
            try:
                report = await asyncio.to_thread(
                    read_ready_file, ready_file, process, ready_timeout_s
                )
            except RuntimeError as exc:
                raise RuntimeError(f"mock engine {exc}") from None
            async with _healthy(process, host, report, ready_timeout_s) as engine:
                yield engine
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(process.wait, 10.0)
                except subprocess.TimeoutExpired:
                    process.kill()
                    await asyncio.to_thread(process.wait)


@contextlib.asynccontextmanager
async def _healthy(
    process: subprocess.Popen[bytes], host: str, report: dict[str, Any], timeout_s: float
) -> AsyncIterator[SpawnedEngine]:
    port = int(report["port"])
    ready = asyncio.ensure_future(wait_healthy(f"{host}:{port}", timeout_s=timeout_s))
    while not ready.done():
        if process.poll() is not None:
            ready.cancel()
            raise RuntimeError(f"mock engine exited early with code {process.returncode}")
        await asyncio.wait({ready}, timeout=0.1)
    ready.result()
    yield SpawnedEngine(process, host, port, report)


@contextlib.asynccontextmanager
async def kv_subscriber(
    endpoint: str, *, topic: bytes = b"", timeout_s: float = 5.0, settle_s: float = 0.1
) -> AsyncIterator[zmq.asyncio.Socket]:
    """A SUB socket connected to `endpoint`, past its handshake and given `settle_s` for the
    subscription to reach the publisher (ZMQ has no acknowledgement for it); closed on exit."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, topic)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        sock.connect(endpoint.replace("*", "127.0.0.1"))
        if not await monitor.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no ZMQ handshake with {endpoint} in {timeout_s}s")
        await monitor.recv_multipart()
        await asyncio.sleep(settle_s)
        yield sock
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()


async def kv_replay(endpoint: str, start: int, *, timeout_s: float = 5.0) -> list[list[bytes]]:
    """Ask a replay ROUTER for the batches from `start`: every reply as the DEALER reads it
    (`[b"", seq, payload]` or `[b"", topic, seq, payload]`), the end marker last.
    TimeoutError when a reply takes longer than `timeout_s`."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    replies: list[list[bytes]] = []
    try:
        sock.connect(endpoint.replace("*", "127.0.0.1"))
        await sock.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            if not await sock.poll(int(timeout_s * 1000)):
                raise TimeoutError(f"no KV replay reply from {endpoint} in {timeout_s}s")
            frames = await sock.recv_multipart()
            replies.append(frames)
            if len(frames) >= 3 and frames[-2] == END_SEQ:
                return replies
    finally:
        sock.close(linger=0)
        ctx.term()


def tokenizer_dir_with_template(dest: Path, chat_template: str) -> Path:
    """A tokenizer folder at `dest`: the shipped tokenizer with a chat template of its own
    (a second "model" for multi-model tests; `mock-engine --tokenizer dest` serves it)."""
    source = default_tokenizer_dir()
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "tokenizer.json", dest / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = chat_template
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest
