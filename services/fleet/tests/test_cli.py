"""`python -m switchyard.fleet` as a real process."""

import asyncio
import contextlib
import signal
import sys

import pytest

from switchyard.common.fleet_client import FleetClient
from switchyard.common.ports import read_ready_file


@contextlib.asynccontextmanager
async def fleet_process(*args: str):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "switchyard.fleet",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.communicate()


async def exit_code(*args: str) -> tuple[int, str]:
    async with fleet_process(*args) as proc:
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
        return proc.returncode, stderr.decode()


class TestCli:
    async def test_serves_then_exits_cleanly_on_sigterm(self, make_engine, until, tmp_path):
        engine = await make_engine("vllm", "--model-name", "cli-model")
        ready = tmp_path / "ready.json"
        args = [
            "--worker",
            engine.url,
            "--control",
            "tcp://127.0.0.1:0",
            "--events",
            "tcp://127.0.0.1:0",
            "--probe-interval",
            "0.2",
            "--ready-file",
            str(ready),
        ]
        async with fleet_process(*args) as proc:
            report = await asyncio.to_thread(read_ready_file, ready, None, 30)
            control, events = report["control"], report["events"]
            assert control != events and not control.endswith(":0")
            async with FleetClient(control, events) as client:
                await client.start(timeout=30)
                await until(lambda: len(client.instances) == 1, "the engine", deadline=30)
                assert next(iter(client.instances.values())).model == "cli-model"
            proc.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0, stderr.decode()
            assert "added instance_id=" in stderr.decode()

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ([], "at least one --worker"),
            (["--worker", "http://h:1"], "scheme must be grpc"),
            (["--worker", "grpc://h:1", "--probe-interval", "0"], "must be > 0"),
            (["--workers-file", "/nonexistent/workers.yaml"], "cannot start"),
        ],
    )
    async def test_bad_config_exits_2(self, args, message):
        code, stderr = await exit_code(*args)
        assert code == 2
        assert message in stderr

    async def test_bad_workers_file_exits_2(self, tmp_path):
        path = tmp_path / "w.yaml"
        path.write_text("- grpc://h:1?colour=red\n")
        code, stderr = await exit_code("--workers-file", str(path))
        assert code == 2
        assert "unknown option colour" in stderr
