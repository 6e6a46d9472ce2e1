"""Prefill/decode disaggregation end to end over real gRPC, two engines per handover.

SGLang: the same DisaggregatedParams go to a prefill and a decode engine at once; the decode
streams, the prefill is drained. vLLM: the prefill (max_tokens 1, stream off) returns
kv_transfer_params_json, forwarded unchanged to the decode. Either way the decode's tokens
equal an aggregated run of the same prompt, and the decode reports the prompt as cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as spb_grpc
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from support.mock_engine import free_port, start_mock_engine, wait_until

from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import MockEngineServer

FAST: dict[str, Any] = {"port": 0, "speedup": 1000.0, "context_length": 512}
BLOCK = 16
PROMPT = list(range(1000, 1040))  # 40 tokens: 2 whole blocks and a partial one
DECODE_TOKENS = 12
ROUTER_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@contextlib.asynccontextmanager
async def engines(*configs: MockEngineConfig) -> AsyncIterator[list[MockEngineServer]]:
    """Start every engine; on exit stop them and check that nothing is left pinned."""
    async with contextlib.AsyncExitStack() as stack:
        started = [await stack.enter_async_context(start_mock_engine(c)) for c in configs]
        yield started
        cores = [server.engine for server in started if server.engine is not None]
        assert len(cores) == len(started)
        await wait_until(lambda: all(core.active_requests == 0 for core in cores))
        for server, core in zip(started, cores, strict=True):
            assert core.cache.pinned_blocks == 0 and len(server.disagg.board) == 0


@contextlib.asynccontextmanager
async def channels(*servers: MockEngineServer) -> AsyncIterator[list[grpc.aio.Channel]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(grpc.aio.insecure_channel(s.target)) for s in servers
        ]


def tokens_of(replies: list[Any]) -> list[int]:
    return [t for r in replies if r.HasField("chunk") for t in r.chunk.token_ids]


# -- SGLang -------------------------------------------------------------------------------


def sglang_request(rid: str, params: Any = None, stream: bool = True) -> Any:
    request = spb.GenerateRequest(
        request_id=rid,
        tokenized=spb.TokenizedInput(input_ids=PROMPT),
        sampling_params=spb.SamplingParams(temperature=0.0, top_k=-1, max_new_tokens=DECODE_TOKENS),
        stream=stream,
    )
    if params is not None:
        request.disaggregated_params.CopyFrom(params)
    return request


async def sglang_generate(channel: grpc.aio.Channel, request: Any) -> list[Any]:
    return [r async for r in spb_grpc.SglangSchedulerStub(channel).Generate(request)]


def sglang_config(role: str, **extra: Any) -> MockEngineConfig:
    return MockEngineConfig(protocol="sglang", role=role, bootstrap_port=0, **FAST, **extra)


class TestSglangHandover:
    async def test_decode_matches_aggregated(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.INFO, logger="switchyard.mock_engine")
        configs = (sglang_config("prefill"), sglang_config("decode"), sglang_config("both"))
        async with engines(*configs) as (prefill, decode, aggregated):
            params = spb.DisaggregatedParams(
                bootstrap_host="127.0.0.1",
                bootstrap_port=prefill.kv_transfer_port,
                bootstrap_room=12345,
            )
            async with channels(prefill, decode, aggregated) as (pc, dc, ac):
                drained, streamed = await asyncio.gather(
                    sglang_generate(pc, sglang_request("pd-1", params)),
                    sglang_generate(dc, sglang_request("pd-1", params)),
                )
                reference = await sglang_generate(ac, sglang_request("agg-1"))
                info = await spb_grpc.SglangSchedulerStub(pc).GetServerInfo(
                    spb.GetServerInfoRequest()
                )
        assert tokens_of(streamed) == tokens_of(reference) and len(tokens_of(reference)) > 0
        done = streamed[-1].complete
        assert done.cached_tokens == len(PROMPT) // BLOCK * BLOCK == 32
        assert {r.chunk.cached_tokens for r in streamed if r.HasField("chunk")} == {32}
        assert reference[-1].complete.cached_tokens == 0
        # The prefill's answer: its first token, "length", after the handover.
        assert tokens_of(drained) == tokens_of(reference)[:1]
        last = drained[-1].complete
        assert (last.finish_reason, last.completion_tokens, list(last.output_ids)) == (
            "length",
            1,
            tokens_of(reference)[:1],
        )
        assert (prefill.kv_transfers.handed_over, decode.kv_transfers.received) == (1, 1)
        assert (decode.kv_transfers.handed_over, prefill.kv_transfers.received) == (0, 0)
        scheduler = json_format.MessageToDict(info.scheduler_info)
        assert scheduler["kv_handed_over"] == 1
        server_args = json_format.MessageToDict(info.server_args)
        assert server_args["disaggregation_mode"] == "prefill"
        assert server_args["disaggregation_bootstrap_port"] == prefill.kv_transfer_port
        messages = [r.getMessage() for r in caplog.records]
        assert any(m.startswith("kv handed over room=12345") for m in messages)
        assert any(m.startswith("kv received room=12345") for m in messages)

    async def test_decode_asks_before_the_prefill_is_done(self) -> None:
        async with engines(sglang_config("prefill"), sglang_config("decode")) as (prefill, decode):
            params = spb.DisaggregatedParams(
                bootstrap_host="127.0.0.1",
                bootstrap_port=prefill.kv_transfer_port,
                bootstrap_room=7,
            )
            async with channels(prefill, decode) as (pc, dc):
                streaming = asyncio.ensure_future(
                    sglang_generate(dc, sglang_request("early", params))
                )
                await wait_until(lambda: prefill.disagg.pending_fetches == 1)  # decode waits
                drained = await sglang_generate(pc, sglang_request("early", params))
                streamed = await streaming
        assert tokens_of(drained) == tokens_of(streamed)[:1]
        assert streamed[-1].complete.cached_tokens == 32
        assert (prefill.kv_transfers.handed_over, decode.kv_transfers.received) == (1, 1)

    async def test_non_streaming_and_many_rooms(self) -> None:
        async with engines(sglang_config("prefill"), sglang_config("decode")) as (p, d):
            async with channels(p, d) as (pc, dc):

                def params(room: int) -> Any:
                    return spb.DisaggregatedParams(
                        bootstrap_host="127.0.0.1", bootstrap_port=p.kv_transfer_port,
                        bootstrap_room=room,
                    )  # fmt: skip

                legs = []
                for room in range(5):
                    legs.append(
                        sglang_generate(pc, sglang_request(f"r{room}", params(room), False))
                    )
                    legs.append(
                        sglang_generate(dc, sglang_request(f"r{room}", params(room), False))
                    )
                replies = await asyncio.gather(*legs)
        decoded = [r[-1].complete for r in replies[1::2]]
        assert len({tuple(c.output_ids) for c in decoded}) == 1  # same prompt, same tokens
        assert all(len(r) == 1 and r[0].complete.completion_tokens == 1 for r in replies[::2])
        assert (p.kv_transfers.handed_over, d.kv_transfers.received) == (5, 5)

    async def test_decode_without_room_serves_aggregated(self) -> None:
        async with engines(sglang_config("decode"), sglang_config("both")) as (decode, agg):
            async with channels(decode, agg) as (dc, ac):
                alone = await sglang_generate(dc, sglang_request("solo"))
                reference = await sglang_generate(ac, sglang_request("solo"))
        assert tokens_of(alone) == tokens_of(reference)
        assert alone[-1].complete.cached_tokens == 0 and decode.kv_transfers.received == 0


class TestSglangFailures:
    async def test_decode_times_out_when_nothing_is_handed_over(self) -> None:
        configs = (sglang_config("prefill"), sglang_config("decode", bootstrap_timeout_s=0.2))
        async with engines(*configs) as (prefill, decode):
            params = spb.DisaggregatedParams(
                bootstrap_host="127.0.0.1",
                bootstrap_port=prefill.kv_transfer_port,
                bootstrap_room=99,
            )
            async with channels(decode) as (dc,):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await sglang_generate(dc, sglang_request("lonely", params))
        assert raised.value.code() == grpc.StatusCode.INTERNAL
        details = raised.value.details() or ""
        assert "Decode transfer failed" in details and "bootstrap_room=99" in details
        assert decode.kv_transfers.failed == 1 and decode.kv_transfers.received == 0

    async def test_decode_fails_when_no_prefill_listens(self) -> None:
        async with engines(sglang_config("decode", bootstrap_timeout_s=0.2)) as (decode,):
            params = spb.DisaggregatedParams(
                bootstrap_host="127.0.0.1", bootstrap_port=free_port(), bootstrap_room=5
            )
            async with channels(decode) as (dc,):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await sglang_generate(dc, sglang_request("nobody", params))
        assert raised.value.code() == grpc.StatusCode.INTERNAL
        assert "bootstrap_room=5" in (raised.value.details() or "")

    async def test_prefill_fails_when_no_decode_fetches(self) -> None:
        async with engines(sglang_config("prefill", bootstrap_timeout_s=0.2)) as (prefill,):
            params = spb.DisaggregatedParams(
                bootstrap_host="127.0.0.1",
                bootstrap_port=prefill.kv_transfer_port,
                bootstrap_room=3,
            )
            async with channels(prefill) as (pc,):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await sglang_generate(pc, sglang_request("unfetched", params))
        assert raised.value.code() == grpc.StatusCode.INTERNAL
        assert "bootstrap_room=3" in (raised.value.details() or "")
        assert prefill.kv_transfers.expired == 1 and prefill.kv_transfers.handed_over == 0

    async def test_cancelled_prefill_releases_its_kv(self) -> None:
        async with engines(sglang_config("prefill")) as (prefill,):
            params = spb.DisaggregatedParams(
                bootstrap_host="127.0.0.1",
                bootstrap_port=prefill.kv_transfer_port,
                bootstrap_room=4,
            )
            async with channels(prefill) as (pc,):
                call = spb_grpc.SglangSchedulerStub(pc).Generate(sglang_request("gone", params))
                await wait_until(lambda: len(prefill.disagg.board) == 1)
                call.cancel()
                await wait_until(lambda: len(prefill.disagg.board) == 0)


# -- vLLM ---------------------------------------------------------------------------------


def vllm_request(
    rid: str, params: dict[str, Any] | str | None = None, *, max_tokens: int, stream: bool
) -> Any:
    request = vpb.GenerateRequest(
        request_id=rid,
        tokenized=vpb.TokenizedInput(input_ids=PROMPT),
        sampling_params=vpb.SamplingParams(temperature=0.0, max_tokens=max_tokens),
        stream=stream,
    )
    if params is not None:
        request.kv_transfer_params_json = params if isinstance(params, str) else json.dumps(params)
    return request


async def vllm_generate(channel: grpc.aio.Channel, request: Any) -> list[Any]:
    return [r async for r in vpb_grpc.VllmEngineStub(channel).Generate(request)]


def vllm_config(role: str, **extra: Any) -> MockEngineConfig:
    return MockEngineConfig(protocol="vllm", role=role, **FAST, **extra)


async def vllm_prefill(channel: grpc.aio.Channel, rid: str) -> Any:
    replies = await vllm_generate(
        channel, vllm_request(rid, ROUTER_PREFILL_PARAMS, max_tokens=1, stream=False)
    )
    assert len(replies) == 1 and replies[0].HasField("complete")
    return replies[0].complete


class TestVllmHandover:
    async def test_decode_matches_aggregated(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.INFO, logger="switchyard.mock_engine")
        configs = (vllm_config("prefill"), vllm_config("decode"), vllm_config("both"))
        async with engines(*configs) as (prefill, decode, aggregated):
            async with channels(prefill, decode, aggregated) as (pc, dc, ac):
                first = await vllm_prefill(pc, "v-1")
                handover = json.loads(first.kv_transfer_params_json)
                info = await vpb_grpc.VllmEngineStub(pc).GetServerInfo(vpb.GetServerInfoRequest())
                streamed = await vllm_generate(
                    dc,
                    vllm_request(
                        "v-1", first.kv_transfer_params_json, max_tokens=DECODE_TOKENS, stream=True
                    ),
                )
                reference = await vllm_generate(
                    ac, vllm_request("agg", max_tokens=DECODE_TOKENS, stream=True)
                )
            await wait_until(lambda: prefill.kv_transfers.handed_over == 1)
        assert tokens_of(streamed) == tokens_of(reference) and len(tokens_of(reference)) > 0
        assert list(first.output_ids) == tokens_of(reference)[:1]
        assert first.finish_reason == "length"
        assert streamed[-1].complete.cached_tokens == 32
        assert handover == {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": info.kv_engine_id,
            "remote_request_id": "v-1",
            "remote_block_ids": [0, 1, 2],
            "remote_host": "127.0.0.1",
            "remote_port": prefill.kv_transfer_port,
            "tp_size": 1,
        }
        assert (first.kv_transfer_params.remote_host, first.kv_transfer_params.remote_port) == (
            "127.0.0.1",
            prefill.kv_transfer_port,
        )
        assert info.kv_role == "kv_producer" and info.kv_connector == "NixlConnector"
        assert decode.kv_transfers.received == 1
        messages = [r.getMessage() for r in caplog.records]
        assert any(m.startswith("kv handed over request=v-1") for m in messages)
        assert any(m.startswith("kv received request=v-1") for m in messages)

    async def test_kv_both_serves_either_leg(self) -> None:
        both = vllm_config("both", kv_connector="NixlConnector")
        async with engines(both, both) as (first_engine, second_engine):
            async with channels(first_engine, second_engine) as (fc, sc):
                info = await vpb_grpc.VllmEngineStub(fc).GetServerInfo(vpb.GetServerInfoRequest())
                assert info.kv_role == "kv_both"
                first = await vllm_prefill(fc, "b-1")
                params = first.kv_transfer_params_json
                decoded = await vllm_generate(
                    sc, vllm_request("b-1", params, max_tokens=4, stream=False)
                )
        assert decoded[-1].complete.cached_tokens == 32
        assert second_engine.kv_transfers.received == 1

    async def test_without_connector_params_are_ignored(self) -> None:
        async with engines(vllm_config("both")) as (plain,):
            async with channels(plain) as (channel,):
                first = await vllm_prefill(channel, "plain")
        assert not first.HasField("kv_transfer_params_json") and plain.kv_transfers.handed_over == 0

    async def test_prefill_ended_by_eos_hands_nothing_over(self) -> None:
        async with engines(vllm_config("prefill")) as (prefill,):
            async with channels(prefill) as (pc,):
                replies = await vllm_generate(
                    pc, vllm_request("long", ROUTER_PREFILL_PARAMS, max_tokens=500, stream=False)
                )
        done = replies[-1].complete
        assert done.finish_reason == "stop" and not done.HasField("kv_transfer_params_json")
        assert len(prefill.disagg.board) == 0


class TestVllmFailures:
    async def test_unknown_transfer_id(self) -> None:
        async with engines(vllm_config("prefill"), vllm_config("decode")) as (prefill, decode):
            async with channels(prefill, decode) as (pc, dc):
                first = await vllm_prefill(pc, "known")
                params = json.loads(first.kv_transfer_params_json)
                params["remote_request_id"] = "no-such-request"
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await vllm_generate(dc, vllm_request("d", params, max_tokens=4, stream=True))
                # the real one is still there and can be taken
                ok = await vllm_generate(
                    dc,
                    vllm_request("d2", first.kv_transfer_params_json, max_tokens=4, stream=False),
                )
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no-such-request" in (raised.value.details() or "")
        assert ok[-1].complete.cached_tokens == 32
        assert decode.kv_transfers.failed == 1 and decode.kv_transfers.received == 1

    async def test_expired_transfer(self) -> None:
        configs = (vllm_config("prefill", kv_transfer_ttl_s=0.05), vllm_config("decode"))
        async with engines(*configs) as (prefill, decode):
            async with channels(prefill, decode) as (pc, dc):
                first = await vllm_prefill(pc, "stale")
                await wait_until(lambda: prefill.kv_transfers.expired == 1)
                request = vllm_request(
                    "d", first.kv_transfer_params_json, max_tokens=4, stream=True
                )
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await vllm_generate(dc, request)
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = raised.value.details() or ""
        assert "remote_request_id=stale" in details and "expired" in details

    async def test_taken_twice(self) -> None:
        async with engines(vllm_config("prefill"), vllm_config("decode")) as (prefill, decode):
            async with channels(prefill, decode) as (pc, dc):
                params = (await vllm_prefill(pc, "once")).kv_transfer_params_json
                await vllm_generate(dc, vllm_request("d1", params, max_tokens=2, stream=False))
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await vllm_generate(dc, vllm_request("d2", params, max_tokens=2, stream=False))
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    async def test_side_channel_unreachable(self) -> None:
        async with engines(vllm_config("decode")) as (decode,):
            params = {
                "do_remote_prefill": True,
                "remote_request_id": "x",
                "remote_host": "127.0.0.1",
                "remote_port": free_port(),
            }
            async with channels(decode) as (dc,):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await vllm_generate(dc, vllm_request("d", params, max_tokens=2, stream=True))
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "remote_request_id=x" in (raised.value.details() or "")

    @pytest.mark.parametrize("params", ['{"do_remote_prefill": true}', "[1, 2]", "not json"])
    async def test_malformed_params(self, params: str) -> None:
        async with engines(vllm_config("decode")) as (decode,):
            async with channels(decode) as (dc,):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await vllm_generate(dc, vllm_request("d", params, max_tokens=2, stream=True))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
