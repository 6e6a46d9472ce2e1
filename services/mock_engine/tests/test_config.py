"""MockEngineConfig fails loudly on bad values."""

from __future__ import annotations

import math

import pytest

from switchyard.mock_engine.config import EngineProtocol, MockEngineConfig, Role
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
        ],
    )
    def test_bad_values_raise(self, field: str, value: object) -> None:
        kwargs: dict[str, object] = {"protocol": "sglang", "port": 5000, field: value}
        with pytest.raises(ConfigError) as raised:
            MockEngineConfig(**kwargs)  # type: ignore[arg-type]
        assert raised.value.field == field

    def test_frozen(self) -> None:
        config = MockEngineConfig(protocol="sglang", port=5000)
        with pytest.raises(AttributeError):
            config.port = 1  # type: ignore[misc]
