"""Load the engines' own KV-event publisher modules (vendor/, see README.md) without their
packages: each file runs as a module of its own, with stand-ins for the names it imports
present in sys.modules only while it executes."""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import logging
import sys
import types
from pathlib import Path
from types import ModuleType
from typing import Any

VENDOR = Path(__file__).parent / "vendor"


def _module(name: str, **attrs: Any) -> ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


# ---- vLLM 0.33.0 ---------------------------------------------------------------------------


@dataclasses.dataclass
class _VllmKVEventsConfig:
    """vllm.config.kv_events.KVEventsConfig's fields (a plain dataclass here)."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"


def _is_valid_ipv6_address(address: str) -> bool:
    try:
        ipaddress.IPv6Address(address)
        return True
    except ValueError:
        return False


def _get_tcp_uri(ip: str, port: int) -> str:
    return f"tcp://[{ip}]:{port}" if _is_valid_ipv6_address(ip) else f"tcp://{ip}:{port}"


def _split_zmq_path(path: str) -> tuple[str, str, str]:
    scheme, _, rest = path.partition("://")
    host, _, port = rest.rpartition(":")
    return scheme, host.strip("[]"), port


def _vllm_stand_ins() -> dict[str, ModuleType]:
    return {
        "vllm": _module("vllm"),
        "vllm.config": _module("vllm.config"),
        "vllm.config.kv_events": _module(
            "vllm.config.kv_events", KVEventsConfig=_VllmKVEventsConfig
        ),
        "vllm.logger": _module("vllm.logger", init_logger=logging.getLogger),
        "vllm.utils": _module("vllm.utils"),
        "vllm.utils.network_utils": _module(
            "vllm.utils.network_utils",
            get_ip=lambda: "127.0.0.1",
            get_tcp_uri=_get_tcp_uri,
            is_valid_ipv6_address=_is_valid_ipv6_address,
            split_zmq_path=_split_zmq_path,
        ),
        "vllm.v1": _module("vllm.v1"),
        "vllm.v1.core": _module("vllm.v1.core"),
        "vllm.v1.core.kv_cache_utils": _module(
            "vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int
        ),
    }


# ---- SGLang 0.5.23 -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _NetworkAddress:
    """sglang.srt.utils.network.NetworkAddress: what kv_events.py uses of it."""

    host: str
    port: int

    def __post_init__(self) -> None:
        if self.host.startswith("[") and self.host.endswith("]"):
            object.__setattr__(self, "host", self.host[1:-1])

    @property
    def is_ipv6(self) -> bool:
        return _is_valid_ipv6_address(self.host)

    def to_tcp(self) -> str:
        host = f"[{self.host}]" if self.is_ipv6 else self.host
        return f"tcp://{host}:{self.port}"

    @staticmethod
    def parse(addr: str) -> _NetworkAddress:
        if not addr:
            raise ValueError("Empty address string")
        if addr.startswith("["):
            close = addr.find("]")
            if close == -1 or addr[close + 1 : close + 2] != ":":
                raise ValueError(f"bad IPv6 address {addr!r}")
            return _NetworkAddress(addr[1:close], int(addr[close + 2 :]))
        host, sep, port = addr.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(f"cannot parse {addr!r}")
        return _NetworkAddress(host, int(port))


@dataclasses.dataclass
class _Parallel:
    pp_rank: int = 0
    attn_tp_rank: int = 0
    attn_cp_rank: int = 0
    attn_dp_size: int = 1
    attn_dp_rank: int = 0
    dp_rank: int | None = None


def _sglang_stand_ins() -> dict[str, ModuleType]:
    return {
        "sglang": _module("sglang"),
        "sglang.srt": _module("sglang.srt"),
        "sglang.srt.runtime_context": _module(
            "sglang.srt.runtime_context", get_parallel=lambda: _Parallel()
        ),
        "sglang.srt.utils": _module("sglang.srt.utils"),
        "sglang.srt.utils.network": _module(
            "sglang.srt.utils.network", NetworkAddress=_NetworkAddress
        ),
    }


# ---- loading -------------------------------------------------------------------------------

_LOADED: dict[str, ModuleType] = {}


def _load(name: str, path: Path, stand_ins: dict[str, ModuleType]) -> ModuleType:
    if name in _LOADED:
        return _LOADED[name]
    saved = {key: sys.modules.get(key) for key in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # msgspec and dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    _LOADED[name] = module
    return module


def vllm_kv_events() -> ModuleType:
    """vLLM 0.33.0's vllm/distributed/kv_events.py."""
    return _load(
        "pinned_vllm_0_33_0_kv_events", VENDOR / "vllm_0_33_0" / "kv_events.py", _vllm_stand_ins()
    )


def sglang_kv_events() -> ModuleType:
    """SGLang 0.5.23's sglang/srt/disaggregation/kv_events.py."""
    return _load(
        "pinned_sglang_0_5_23_kv_events",
        VENDOR / "sglang_0_5_23" / "kv_events.py",
        _sglang_stand_ins(),
    )


__all__ = ["sglang_kv_events", "vllm_kv_events"]
