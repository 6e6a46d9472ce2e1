"""Fixtures for fleet's tests: mock engines as real processes (`python -m
switchyard.mock_engine`) that bind their own ports (and keep them across a restart), free
ports for in-process sockets, and a bounded polling helper."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from switchyard.common.engines import connect
from switchyard.common.errors import EngineError
from switchyard.common.ports import free_port

DEADLINE = 20.0
START_DEADLINE = 90.0  # a process start on a loaded 2-core machine


async def until(predicate: Callable[[], object], what: str, deadline: float = DEADLINE) -> None:
    """Poll `predicate` until true; fail (not sleep-assert) after `deadline` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class MockEngine:
    """One mock engine process; its first start binds a free port (reported in its ready
    file), and stop() then start() is an engine restart on that port."""

    def __init__(self, protocol: str, *args: str) -> None:
        self.protocol, self.port, self.args = protocol, 0, args
        self.process: asyncio.subprocess.Process | None = None
        self.spawned: list[asyncio.subprocess.Process] = []  # every process, restarts too

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    async def start(self) -> None:
        with tempfile.TemporaryDirectory(prefix="fleet-test-") as folder:
            ready = Path(folder) / "ready.json"
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "switchyard.mock_engine",
                "--protocol",
                self.protocol,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--ready-file",
                str(ready),
                *self.args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
            )
            self.spawned.append(self.process)
            loop = asyncio.get_running_loop()
            end = loop.time() + START_DEADLINE
            while not ready.exists():
                if self.process.returncode is not None:
                    raise RuntimeError(f"mock engine exited with {self.process.returncode}")
                if loop.time() > end:
                    raise AssertionError("the mock engine did not report its port")
                await asyncio.sleep(0.05)
            self.port = int(json.loads(ready.read_text())["port"])
        while True:  # ready when fleet's own detection succeeds
            if self.process.returncode is not None:
                raise RuntimeError(f"mock engine exited with {self.process.returncode}")
            try:
                client = await connect(self.url, timeout=0.5)
            except EngineError:
                if loop.time() > end:
                    raise
                await asyncio.sleep(0.05)
            else:
                await client.close()
                return

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


@pytest.fixture
async def make_engine():
    """Factory of started MockEngines (protocol, extra CLI args); all stopped at teardown,
    also when the test fails."""
    started: list[MockEngine] = []

    async def make(protocol: str, *args: str) -> MockEngine:
        engine = MockEngine(protocol, *args)
        started.append(engine)
        await engine.start()
        return engine

    yield make
    for engine in started:
        await engine.stop()
    assert all(p.returncode is not None for e in started for p in e.spawned), "engine left running"


@pytest.fixture(name="until")
def until_fixture():
    return until


@pytest.fixture(name="free_port")
def free_port_fixture():
    return free_port
