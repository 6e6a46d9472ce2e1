"""MockEngineConfig fails loudly on bad values."""

from __future__ import annotations

import math

import pytest

from switchyard.mock_engine.config import (
    EngineProtocol,
    EventFormat,
    HashForm,
    MockEngineConfig,
    Role,
    parse_seq_list,
)
from switchyard.mock_engine.errors import ConfigError


class TestConfig:
    def test_defaults(self) -> None:
        config = MockEngineConfig(protocol="sglang", port=5000)
        assert config.protocol is EngineProtocol.SGLANG
        assert config.role is Role.BOTH
        assert config.model_name == "deepseek-mock"
        assert (config.tokenizer_path / "tokenizer.json").is_file()
        assert config.kv_pool_tokens == 4096 * 16
        assert config.ttft_s == pytest.approx(0.020)

    def test_speedup_divides_delays(self) -> None:
        config = MockEngineConfig(protocol="vllm", port=1, ttft_ms=20, itl_ms=5, speedup=10)
        assert config.ttft_s == pytest.approx(0.002)
        assert config.itl_s == pytest.approx(0.0005)

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("port", -1),
            ("port", 65536),
            ("ttft_ms", -1.0),
            ("itl_ms", -0.5),
            ("itl_ms", math.nan),
            ("speedup", 0.0),
            ("speedup", -2.0),
            ("context_length", 1),
            ("block_size", 0),
            ("num_blocks", 0),
            ("protocol", "trtllm"),
            ("role", "encoder"),
            ("log_level", "LOUD"),
            ("prefill_base_ms", -1.0),
            ("prefill_ms_per_token", math.inf),
            ("prefill_superlinear_tokens", 0),
            ("batch_slowdown", math.nan),
            ("kv_events_endpoint", "localhost:5557"),
            ("kv_replay_endpoint", "http://x"),
            ("kv_events_format", "json"),
            ("kv_hash_form", "hex"),
            ("kv_hash_seed", -1),
            ("kv_replay_buffer", 0),
            ("kv_skip_seqs", "1,x"),
            ("kv_skip_seqs", "-3"),
            ("bootstrap_port", 70000),
            ("side_channel_port", -1),
            ("bootstrap_timeout_s", 0.0),
            ("kv_transfer_ttl_s", math.inf),
            ("kv_connector", "NixlConnector"),  # a vLLM setting, refused on SGLang
            ("warm_up_requests", 1),  # the vLLM servicer's warm-up, refused on SGLang
            ("warm_up_ms", -1.0),
        ],
    )
    def test_bad_values_raise(self, field: str, value: object) -> None:
        kwargs: dict[str, object] = {"protocol": "sglang", "port": 5000, field: value}
        with pytest.raises(ConfigError) as raised:
            MockEngineConfig(**kwargs)  # type: ignore[arg-type]
        assert raised.value.field == field

    def test_kv_defaults(self) -> None:
        config = MockEngineConfig(protocol="sglang", port=5000)
        assert config.kv_events_endpoint is None and config.kv_replay_endpoint is None
        assert config.kv_events_format is EventFormat.MAP and config.kv_hash_form is HashForm.UINT
        assert config.kv_replay_buffer == 10000 and config.kv_skip_seqs == frozenset()
        assert config.sglang_kv_events_config() is None
        assert (config.prefill_base_ms, config.prefill_ms_per_token) == (5.0, 0.05)
        assert (config.prefill_superlinear_tokens, config.batch_slowdown) == (8192, 0.02)

    def test_skip_seqs_parse(self) -> None:
        assert parse_seq_list("3, 4,,9") == frozenset({3, 4, 9})
        assert parse_seq_list([1, 2]) == parse_seq_list("1,2") == frozenset({1, 2})
        config = MockEngineConfig(protocol="vllm", port=1, kv_skip_seqs=frozenset({5}))
        assert config.kv_skip_seqs == frozenset({5})

    def test_same_endpoint_twice_is_refused(self) -> None:
        with pytest.raises(ConfigError):
            MockEngineConfig(
                protocol="vllm",
                port=1,
                kv_events_endpoint="tcp://*:5557",
                kv_replay_endpoint="tcp://*:5557",
            )

    @pytest.mark.parametrize(
        "kwargs",
        [{"warm_up_requests": -1}, {"warm_up_requests": 1, "embedding": True},
         {"warm_up_requests": 1, "block_size": 128, "context_length": 512}],
    )  # fmt: skip
    def test_bad_warm_up_raises(self, kwargs: dict[str, object]) -> None:
        with pytest.raises(ConfigError) as raised:
            MockEngineConfig(protocol="vllm", port=1, **kwargs)  # type: ignore[arg-type]
        assert raised.value.field == "warm_up_requests"

    def test_frozen(self) -> None:
        config = MockEngineConfig(protocol="sglang", port=5000)
        with pytest.raises(AttributeError):
            config.port = 1  # type: ignore[misc]


class TestDisaggregationConfig:
    def test_defaults(self) -> None:
        config = MockEngineConfig(protocol="sglang", port=1)
        assert (config.bootstrap_port, config.bootstrap_timeout_s) == (8998, 10.0)
        assert (config.side_channel_port, config.kv_transfer_ttl_s) == (0, 30.0)
        assert not config.kv_producer and not config.kv_consumer

    @pytest.mark.parametrize(
        ("role", "connector", "kv_role", "producer", "consumer"),
        [
            ("prefill", None, "kv_producer", True, False),
            ("decode", None, "kv_consumer", False, True),
            ("both", None, "", False, False),
            ("both", "NixlConnector", "kv_both", True, True),
        ],
    )
    def test_vllm_roles(
        self, role: str, connector: str | None, kv_role: str, producer: bool, consumer: bool
    ) -> None:
        config = MockEngineConfig(protocol="vllm", port=1, role=role, kv_connector=connector)
        assert config.vllm_kv_role == kv_role
        assert (config.kv_producer, config.kv_consumer) == (producer, consumer)
        if kv_role:
            assert config.kv_connector == "NixlConnector"

    def test_sglang_roles(self) -> None:
        prefill = MockEngineConfig(protocol="sglang", port=1, role="prefill")
        decode = MockEngineConfig(protocol="sglang", port=1, role="decode")
        assert prefill.kv_producer and not prefill.kv_consumer
        assert decode.kv_consumer and not decode.kv_producer
