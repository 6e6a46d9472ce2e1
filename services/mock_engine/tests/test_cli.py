"""`python -m switchyard.mock_engine` as a real process: serves, answers, stops on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path

import grpc
import msgspec
import pytest
from smg_grpc_proto import vllm_engine_pb2 as pb
from smg_grpc_proto import vllm_engine_pb2_grpc as pb_grpc
from support.mock_engine import kv_replay, spawn_mock_engine

from switchyard.mock_engine.cli import add_arguments, config_from_args, run
from switchyard.mock_engine.config import EngineProtocol, EventFormat, HashForm, Role


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
        assert run(self.parse("--protocol", "sglang", "--port", "1", "--kv-skip-seq", "x")) == 2

    def test_openai_surface_flags(self, tmp_path: Path) -> None:
        script = tmp_path / "script.json"
        script.write_text(json.dumps([{"marker": "hi", "output": "hello"}]))
        args = self.parse(
            "--protocol", "vllm", "--port", "1", "--embedding", "--embedding-dim", "48",
            "--max-logprobs", "5", "--script", str(script),
        )  # fmt: skip
        config = config_from_args(args)
        assert (config.embedding, config.embedding_dim, config.max_logprobs) == (True, 48, 5)
        assert config.script is not None and config.script.match("say hi").output == "hello"  # type: ignore[union-attr]
        defaults = config_from_args(self.parse("--protocol", "vllm", "--port", "1"))
        assert (defaults.embedding, defaults.script) == (False, None)

    def test_a_bad_script_exits_with_2(self, tmp_path: Path) -> None:
        bad = tmp_path / "bad.json"
        bad.write_text("not json")
        assert run(self.parse("--protocol", "sglang", "--port", "1", "--script", str(bad))) == 2
        assert run(self.parse("--protocol", "sglang", "--port", "1", "--embedding-dim", "0")) == 2

    def test_timing_and_kv_flags(self) -> None:
        args = self.parse(
            "--protocol", "sglang", "--port", "1", "--prefill-base-ms", "2",
            "--prefill-ms-per-token", "0.1", "--prefill-superlinear-tokens", "1000",
            "--batch-slowdown", "0.5", "--kv-events-endpoint", "tcp://*:5557",
            "--kv-events-topic", "t", "--kv-events-format", "array", "--kv-hash-bytes",
            "--kv-hash-seed", "9", "--kv-replay-endpoint", "tcp://*:5558",
            "--kv-replay-topic-frame", "--kv-replay-buffer", "50", "--kv-skip-seq", "3,4",
        )  # fmt: skip
        config = config_from_args(args)
        assert (config.prefill_base_ms, config.prefill_ms_per_token) == (2.0, 0.1)
        assert (config.prefill_superlinear_tokens, config.batch_slowdown) == (1000, 0.5)
        assert (config.kv_events_endpoint, config.kv_replay_endpoint) == (
            "tcp://*:5557",
            "tcp://*:5558",
        )
        assert config.kv_events_format is EventFormat.ARRAY
        assert config.kv_hash_form is HashForm.BYTES and config.kv_hash_seed == 9
        assert (config.kv_events_topic, config.kv_replay_topic_frame) == ("t", True)
        assert (config.kv_replay_buffer, config.kv_skip_seqs) == (50, frozenset({3, 4}))

    def test_fault_and_disaggregation_flags(self) -> None:
        args = self.parse(
            "--protocol", "vllm", "--port", "1", "--role", "both", "--kv-connector", "Nixl",
            "--exit-after-tokens", "7", "--hang-after-tokens", "3", "--fail-unavailable", "0.1",
            "--fail-overloaded", "0.2", "--fault-seed", "4", "--bootstrap-port", "0",
            "--bootstrap-timeout", "2.5", "--side-channel-port", "5600", "--kv-transfer-ttl", "9",
        )  # fmt: skip
        config = config_from_args(args)
        assert (config.exit_after_tokens, config.hang_after_tokens) == (7, 3)
        assert (config.fail_unavailable, config.fail_overloaded, config.fault_seed) == (0.1, 0.2, 4)
        assert (config.bootstrap_port, config.bootstrap_timeout_s) == (0, 2.5)
        assert (config.side_channel_port, config.kv_transfer_ttl_s) == (5600, 9.0)
        assert config.vllm_kv_role == "kv_both"

    def test_fault_flags_default_off(self) -> None:
        config = config_from_args(self.parse("--protocol", "sglang", "--port", "1"))
        assert config.exit_after_tokens is None and config.hang_after_tokens is None
        assert (config.fail_unavailable, config.fail_overloaded) == (0.0, 0.0)
        assert config.bootstrap_port == 8998 and config.kv_connector is None

    def test_kv_flag_defaults(self) -> None:
        config = config_from_args(self.parse("--protocol", "vllm", "--port", "1"))
        assert config.kv_hash_form is HashForm.UINT and config.kv_events_endpoint is None
        signed = config_from_args(
            self.parse("--protocol", "vllm", "--port", "1", "--kv-hash-signed")
        )
        assert signed.kv_hash_form is HashForm.INT

    def test_hash_forms_are_exclusive(self) -> None:
        with pytest.raises(SystemExit):
            self.parse("--protocol", "vllm", "--port", "1", "--kv-hash-bytes", "--kv-hash-signed")


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

    async def test_sglang_process_publishes_kv_events(self) -> None:
        local = "tcp://127.0.0.1:0"
        args = ("--kv-events-endpoint", local, "--kv-replay-endpoint", local)
        async with spawn_mock_engine("sglang", "--speedup", "100", *args) as engine:
            assert engine.report["kv_events"] != engine.report["kv_replay"]
            replies = await kv_replay(engine.report["kv_replay"], 0)
        assert replies[0][1] == (0).to_bytes(8, "big")  # AllBlocksCleared, sequence 0
        assert msgspec.msgpack.decode(replies[0][2])[1] == [{"type": "AllBlocksCleared"}]

    async def test_early_exit_is_reported(self) -> None:
        with pytest.raises(RuntimeError):
            async with spawn_mock_engine("sglang", "--speedup", "0"):
                pass
