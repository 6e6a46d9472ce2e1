"""`python -m switchyard.mock_engine` as a real process: serves, answers, stops on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc
import pytest
from smg_grpc_proto import vllm_engine_pb2 as pb
from smg_grpc_proto import vllm_engine_pb2_grpc as pb_grpc

from switchyard.mock_engine.cli import add_arguments, config_from_args, run
from switchyard.mock_engine.config import EngineProtocol, Role
from switchyard.mock_engine.testing import spawn_mock_engine


class TestArguments:
    def parse(self, *argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return parser.parse_args(list(argv))

    def test_flags_build_the_config(self) -> None:
        args = self.parse(
            "--protocol", "vllm", "--port", "7000", "--context-length", "1024",
            "--block-size", "32", "--num-blocks", "10", "--ttft-ms", "1", "--itl-ms", "2",
            "--speedup", "4", "--role", "decode", "--model-name", "m", "--log-level", "debug",
        )  # fmt: skip
        config = config_from_args(args)
        assert config.protocol is EngineProtocol.VLLM and config.role is Role.DECODE
        assert (config.port, config.context_length, config.kv_pool_tokens) == (7000, 1024, 320)
        assert (config.model_name, config.log_level) == ("m", "DEBUG")

    def test_bad_value_exits_with_2(self) -> None:
        assert run(self.parse("--protocol", "sglang", "--port", "70000")) == 2


class TestSubprocess:
    async def test_serves_then_stops_on_sigterm(self) -> None:
        async with spawn_mock_engine("vllm", "--speedup", "100") as engine:
            async with grpc.aio.insecure_channel(engine.target) as channel:
                stub = pb_grpc.VllmEngineStub(channel)
                assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy
                req = pb.GenerateRequest(
                    request_id="p",
                    tokenized=pb.TokenizedInput(input_ids=[10, 20, 30]),
                    sampling_params=pb.SamplingParams(temperature=0.0, max_tokens=4),
                    stream=False,
                )
                replies = [reply async for reply in stub.Generate(req)]
                assert len(replies[-1].complete.output_ids) <= 4
            engine.process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(engine.process.wait, 15)
            assert code == 0

    async def test_early_exit_is_reported(self) -> None:
        with pytest.raises(RuntimeError):
            async with spawn_mock_engine("sglang", "--speedup", "0"):
                pass
