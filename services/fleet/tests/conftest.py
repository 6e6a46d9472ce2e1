"""Fixtures for fleet's tests: mock engines as real processes (`python -m
switchyard.mock_engine`) on fixed loopback ports, free ports, and a bounded polling helper."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable

import pytest

from switchyard.common.engines import connect
from switchyard.common.errors import EngineError
from switchyard.common.ports import free_port

DEADLINE = 20.0


async def until(predicate: Callable[[], object], what: str, deadline: float = DEADLINE) -> None:
    """Poll `predicate` until true; fail (not sleep-assert) after `deadline` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class MockEngine:
    """One mock engine process on a fixed port; stop() then start() is an engine restart."""

    def __init__(self, protocol: str, port: int, *args: str) -> None:
        self.protocol, self.port, self.args = protocol, port, args
        self.url = f"grpc://127.0.0.1:{port}"
        self.process: asyncio.subprocess.Process | None = None
        self.spawned: list[asyncio.subprocess.Process] = []  # every process, restarts too

    async def start(self) -> None:
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
            *self.args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
        )
        loop = asyncio.get_running_loop()
        end = loop.time() + DEADLINE
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
        engine = MockEngine(protocol, free_port(), *args)
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
