"""The mock vLLM engine answers a gateway as the real one does (vLLM 0.32 CPU build, servicer
smg-grpc-servicer 0.14.1), checked against what the real-engine suite recorded from a real
engine (fixtures/vllm_real.json; tests/real_engines/test_a_wire_shapes.py keeps it current).

Compared: which fields each info reply sets and their types, the values that are no model's
own, the status codes and words of every refusal (numbers blanked: the models differ), abort
behaviour, the KV events' frames and keys, the replay frames. Not compared, by design: the
model's own numbers (context 2048 vs 8192, block size 128 on CPU vs the mock's 16, max_num_seqs)
and the servicer's warm-up (the mock starts with an empty cache: docs/real-engines.md).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support.mock_engine import kv_replay, spawn_mock_engine
from support.wire_shapes import blank_numbers, observe

REAL = json.loads((Path(__file__).parent / "fixtures" / "vllm_real.json").read_text())
SAME_VALUES = {
    "GetModelInfo": ("is_generation", "eos_token_ids", "vocab_size", "supports_vision",
                     "default_sampling_params_json"),
    "GetServerInfo": ("server_type", "kv_role", "kv_connector", "kv_cache_dtype",
                      "data_parallel_size", "constrained_decoding_start", "is_paused",
                      "attention_backend", "engine_reasoning_parser"),
}  # fmt: skip

pytestmark = pytest.mark.timeout(120)


async def _observe_a_mock() -> dict:
    async with spawn_mock_engine(
        "vllm", "--speedup", "50",
        "--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-replay-endpoint", "tcp://127.0.0.1:0",
    ) as engine:  # fmt: skip
        seen = await observe(engine.target, engine.report["kv_events"])
        seen["replay"] = await kv_replay(engine.report["kv_replay"], start=0)
        return seen


@pytest.fixture(scope="module")
def mock() -> dict:
    return asyncio.run(_observe_a_mock())


class TestSameAsTheRealEngine:
    @pytest.mark.parametrize("rpc", ["GetModelInfo", "GetServerInfo", "GetLoads"])
    def test_info_replies_set_the_same_fields(self, mock, rpc):
        assert mock[rpc]["shape"] == REAL[rpc]["shape"]
        for name in SAME_VALUES.get(rpc, ()):
            assert mock[rpc]["value"][name] == REAL[rpc]["value"][name], name

    def test_max_req_input_len_is_the_context(self, mock):
        for seen in (mock, REAL):
            info = seen["GetModelInfo"]["value"]
            assert info["max_req_input_len"] == info["max_context_length"]

    @pytest.mark.parametrize("case", sorted(REAL["errors"]))
    def test_refusals_in_the_same_code_and_words(self, mock, case):
        ours, real = mock["errors"][case], REAL["errors"][case]
        assert ours["code"] == real["code"]
        assert blank_numbers(ours["message"]) == blank_numbers(real["message"])

    def test_abort(self, mock):
        assert mock["abort_mid_stream"] == REAL["abort_mid_stream"]
        assert mock["abort_unknown_id"] == REAL["abort_unknown_id"]

    def test_kv_events_frames_and_keys(self, mock):
        assert mock["kv_events"] == REAL["kv_events"]

    def test_replay_frames(self, mock):
        frames = mock["replay"]
        assert sorted({len(f) for f in frames[:-1]}) == REAL["warm_up"]["replay_frames"]
        assert [len(frames[-1])] == REAL["warm_up"]["end_marker_frames"]
