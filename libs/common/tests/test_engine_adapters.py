"""The engine adapters' data-parallel facts: the DP size each family reports (read against a
mock engine over real gRPC), and data_parallel_rank in the GenerateRequest they build."""

import grpc
import pytest

from switchyard.common.engines.sglang import SglangClient
from switchyard.common.engines.vllm import VllmClient
from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import start_mock_engine
from switchyard.protos.messages import GenerateRequest, SamplingParams

CLIENTS = {"sglang": SglangClient, "vllm": VllmClient}


def request(rank):
    return GenerateRequest(
        request_id="r",
        instance_id=1,
        token_ids=[1, 2, 3],
        sampling=SamplingParams(max_tokens=4),
        data_parallel_rank=rank,
    )


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
class TestDataParallel:
    def test_rank_pinned_only_when_given(self, protocol):
        client_type = CLIENTS[protocol]
        pinned = client_type.build_request(request(1))
        assert pinned.HasField("data_parallel_rank") and pinned.data_parallel_rank == 1
        zero = client_type.build_request(request(0))
        assert zero.HasField("data_parallel_rank") and zero.data_parallel_rank == 0
        assert not client_type.build_request(request(None)).HasField("data_parallel_rank")

    async def test_dp_size_from_server_info(self, protocol):
        config = MockEngineConfig(protocol=protocol, port=0, dp_size=2)
        async with start_mock_engine(config) as engine:
            channel = grpc.aio.insecure_channel(engine.target)
            client = CLIENTS[protocol](channel, 1)
            try:
                info = await client.info(timeout=5)
            finally:
                await client.close()
        assert info.dp_size == 2


def test_sglang_dp_size_counts_attention_dp():
    from switchyard.common.engines.sglang import _dp_size

    assert _dp_size({}) == 1
    assert _dp_size({"dp_size": 4.0}) == 4  # Struct numbers arrive as floats
    assert _dp_size({"dp_size": 1, "attn_dp_size": 8}) == 8  # newer SGLang's DP attention
    assert _dp_size({"dp_size": 2, "attn_dp_size": 2}) == 4
