"""The adapters' reading of engine replies over real gRPC: logprobs, prompt logprobs and n
choices from scripted servicers shaped as the stock servicers send them; Embed; model info."""

import array
import contextlib

import grpc
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as spb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sgrpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vgrpc

from switchyard.common import errors
from switchyard.common.engines.connect import client_for
from switchyard.common.errors import EngineError
from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import start_mock_engine
from switchyard.protos.messages import (
    DeltaDetail,
    GenerateFinished,
    GenerateRequest,
    PromptLogprobs,
    SamplingParams,
    TokenDelta,
    TokenLogprobs,
)

# Every Generate stream here runs over both transports (conftest.both_transports).
pytestmark = pytest.mark.usefixtures("both_transports")

PB = {"sglang": spb, "vllm": vpb}


def out_lp(pb, ids, values, tops=()):
    message = pb.OutputLogProbs(token_logprobs=values, token_ids=ids)
    for top_ids, top_values in tops:
        message.top_logprobs.append(pb.TopLogProbs(token_ids=top_ids, values=top_values))
    return message


def in_lp(pb, ids, values, tops):
    message = pb.InputLogProbs(token_ids=ids)
    for value in values:
        entry = pb.InputTokenLogProb()
        if value is not None:
            entry.value = value
        message.token_logprobs.append(entry)
    for top_ids, top_values in tops:
        message.top_logprobs.append(pb.TopLogProbs(token_ids=top_ids, values=top_values))
    return message


class Scripted:
    """Replays GenerateResponses and answers Embed with a fixed vector."""

    def __init__(self, replies=(), embedding=(), dim=None, code=None):
        self.replies, self.embedding, self.dim, self.code = list(replies), embedding, dim, code
        self.requests = []

    async def Generate(self, request, context):
        self.requests.append(request)
        for reply in self.replies:
            yield reply

    async def Embed(self, request, context):
        self.requests.append(request)
        if self.code is not None:
            await context.abort(self.code, "injected")
        dim = len(self.embedding) if self.dim is None else self.dim
        pb = spb if isinstance(request, spb.EmbedRequest) else vpb
        return pb.EmbedResponse(embedding=self.embedding, embedding_dim=dim, prompt_tokens=3)


class ScriptedSglang(Scripted, sgrpc.SglangSchedulerServicer):
    pass


class ScriptedVllm(Scripted, vgrpc.VllmEngineServicer):
    pass


@contextlib.asynccontextmanager
async def serve(protocol, servicer):
    server = grpc.aio.server()
    if protocol == "sglang":
        sgrpc.add_SglangSchedulerServicer_to_server(servicer, server)
    else:
        vgrpc.add_VllmEngineServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = client_for(protocol, f"grpc://127.0.0.1:{port}", 9)
    try:
        yield client
    finally:
        await client.close()
        await server.stop(None)


def servicer(protocol, replies=(), **kw):
    return (ScriptedSglang if protocol == "sglang" else ScriptedVllm)(replies, **kw)


def chunk(pb, **fields):
    return pb.GenerateResponse(chunk=pb.GenerateStreamChunk(**fields))


def complete(pb, **fields):
    fields.setdefault("finish_reason", "stop")
    return pb.GenerateResponse(complete=pb.GenerateComplete(**fields))


def request(**fields):
    sampling = fields.pop("sampling", SamplingParams(max_tokens=8))
    return GenerateRequest(
        request_id="r", instance_id=9, token_ids=[1, 2, 3], sampling=sampling, **fields
    )


async def run(client, req):
    return [event async for event in client.generate(req)]


PROTOCOLS = ["sglang", "vllm"]


class TestLogprobs:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_streamed_logprobs_and_prompt_logprobs(self, protocol):
        pb = PB[protocol]
        prompt = in_lp(
            pb,
            [1, 2, 3],
            [None, -3.0, -4.0],
            [([], []), ([2, 9], [-3.0, -3.5]), ([3, 9], [-4.0, -4.5])],
        )
        replies = [
            chunk(
                pb,
                token_ids=[10],
                output_logprobs=out_lp(pb, [10], [-0.5], [([10, 11, 12], [-0.5, -1.0, -2.0])]),
                input_logprobs=prompt,
            ),
            chunk(
                pb,
                token_ids=[11, 12],
                output_logprobs=out_lp(
                    pb,
                    [11, 12],
                    [-0.25, -0.75],
                    [([11, 5, 6], [-0.25, -2.0, -3.0]), ([12, 7, 8], [-0.75, -1.0, -1.5])],
                ),
            ),
            # a streamed complete repeats the last chunk (ids and logprobs): not counted again
            complete(
                pb,
                output_ids=[11, 12],
                prompt_tokens=3,
                output_logprobs=out_lp(pb, [11, 12], [-0.25, -0.75]),
            ),
        ]
        async with serve(protocol, servicer(protocol, replies)) as client:
            events = await run(client, request(logprobs=2, prompt_logprobs=1))
        first, second, done = events
        assert first == TokenDelta(
            "r",
            [10],
            DeltaDetail(
                0,
                TokenLogprobs([-0.5], [[10, 11]], [[-0.5, -1.0]]),  # cut to the 2 asked
                PromptLogprobs([None, -3.0, -4.0], [[], [2], [3]], [[], [-3.0], [-4.0]]),
            ),
        )
        assert second.logprobs == TokenLogprobs(
            [-0.25, -0.75], [[11, 5], [12, 7]], [[-0.25, -2.0], [-0.75, -1.0]]
        )
        assert second.prompt_logprobs is None and second.index == 0
        assert isinstance(done, GenerateFinished) and done.completion_tokens == 3

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_non_streamed_complete_carries_everything(self, protocol):
        pb = PB[protocol]
        prompt = in_lp(pb, [1, 2, 3], [None, -3.0, -4.0], [])
        replies = [
            complete(
                pb,
                output_ids=[10, 11],
                prompt_tokens=3,
                output_logprobs=out_lp(pb, [10, 11], [-0.5, -0.25]),
                input_logprobs=prompt,
            )
        ]
        async with serve(protocol, servicer(protocol, replies)) as client:
            events = await run(client, request(stream=False, logprobs=0, prompt_logprobs=0))
        delta, done = events
        assert delta.token_ids == [10, 11] and delta.logprobs == TokenLogprobs([-0.5, -0.25])
        assert delta.prompt_logprobs == PromptLogprobs([None, -3.0, -4.0])
        assert done.completion_tokens == 2

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_prompt_logprobs_without_tokens_come_in_an_empty_delta(self, protocol):
        pb = PB[protocol]
        prompt = in_lp(pb, [1, 2, 3], [None, -3.0, -4.0], [])
        replies = [
            chunk(pb, token_ids=[], input_logprobs=prompt),
            chunk(pb, token_ids=[10]),
            complete(pb, output_ids=[10]),
        ]
        async with serve(protocol, servicer(protocol, replies)) as client:
            events = await run(client, request(prompt_logprobs=0))
        assert events[0].token_ids == [] and events[0].prompt_logprobs is not None
        assert events[1] == TokenDelta("r", [10])  # no logprobs asked: no detail

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    @pytest.mark.parametrize(
        "reply,problem",
        [
            ("missing", "no logprobs"),
            ("short", "1 logprobs for 2 tokens"),
        ],
    )
    async def test_logprobs_that_do_not_cover_the_tokens(self, protocol, reply, problem):
        pb = PB[protocol]
        lp = None if reply == "missing" else out_lp(pb, [10], [-0.5])
        replies = [chunk(pb, token_ids=[10, 11], output_logprobs=lp), complete(pb)]
        async with serve(protocol, servicer(protocol, replies)) as client:
            with pytest.raises(EngineError) as raised:
                await run(client, request(logprobs=0))
        assert raised.value.kind == errors.ENGINE_ERROR and problem in raised.value.message

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_prompt_logprobs_asked_but_never_sent(self, protocol):
        pb = PB[protocol]
        replies = [chunk(pb, token_ids=[10]), complete(pb, output_ids=[10])]
        async with serve(protocol, servicer(protocol, replies)) as client:
            with pytest.raises(EngineError) as raised:
                await run(client, request(prompt_logprobs=0))
        assert (
            raised.value.kind == errors.ENGINE_ERROR and "prompt logprobs" in raised.value.message
        )


class TestChoices:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_interleaved_choices_end_after_n_completes(self, protocol):
        pb = PB[protocol]
        replies = [
            chunk(pb, token_ids=[10], index=0),
            chunk(pb, token_ids=[20], index=1),
            chunk(pb, token_ids=[21], index=1),
            complete(pb, output_ids=[21], index=1, finish_reason="length", prompt_tokens=3),
            chunk(pb, token_ids=[11], index=0),
            complete(pb, output_ids=[11], index=0, prompt_tokens=3),
            chunk(pb, token_ids=[99], index=0),  # after the last complete: never read
        ]
        async with serve(protocol, servicer(protocol, replies)) as client:
            events = await run(client, request(sampling=SamplingParams(max_tokens=2, n=2)))
        deltas = [(e.index, e.token_ids) for e in events if isinstance(e, TokenDelta)]
        assert deltas == [(0, [10]), (1, [20]), (1, [21]), (0, [11])]
        finished = [
            (e.index, e.finish_reason, e.completion_tokens)
            for e in events
            if isinstance(e, GenerateFinished)
        ]
        assert finished == [(1, "length", 2), (0, "stop", 2)]

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_non_streamed_choices(self, protocol):
        pb = PB[protocol]
        replies = [
            complete(pb, output_ids=[10, 11], index=0),
            complete(pb, output_ids=[20], index=1),
        ]
        async with serve(protocol, servicer(protocol, replies)) as client:
            events = await run(
                client, request(stream=False, sampling=SamplingParams(max_tokens=2, n=2))
            )
        assert [(type(e).__name__, e.index) for e in events] == [
            ("TokenDelta", 0),
            ("GenerateFinished", 0),
            ("TokenDelta", 1),
            ("GenerateFinished", 1),
        ]

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_a_stream_that_ends_before_every_choice_is_disconnected(self, protocol):
        pb = PB[protocol]
        replies = [chunk(pb, token_ids=[10], index=0), complete(pb, output_ids=[10], index=0)]
        async with serve(protocol, servicer(protocol, replies)) as client:
            with pytest.raises(EngineError) as raised:
                await run(client, request(sampling=SamplingParams(max_tokens=2, n=2)))
        assert raised.value.kind == errors.DISCONNECTED

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_an_index_out_of_range_is_an_engine_error(self, protocol):
        pb = PB[protocol]
        replies = [chunk(pb, token_ids=[10], index=2), complete(pb, index=2)]
        async with serve(protocol, servicer(protocol, replies)) as client:
            with pytest.raises(EngineError) as raised:
                await run(client, request(sampling=SamplingParams(max_tokens=2, n=2)))
        assert raised.value.kind == errors.ENGINE_ERROR

    async def test_sglang_reasoning_tokens_reach_the_finish(self):
        replies = [complete(spb, output_ids=[5], reasoning_tokens=4)]
        async with serve("sglang", servicer("sglang", replies)) as client:
            events = await run(client, request(stream=False, reasoning=True))
        assert events[-1].reasoning_tokens == 4

    async def test_a_refused_field_fails_before_any_call(self):
        scripted = servicer("sglang", [complete(spb)])
        async with serve("sglang", scripted) as client:
            with pytest.raises(EngineError) as raised:
                await run(client, request(sampling=SamplingParams(max_tokens=2, seed=1)))
        assert (raised.value.kind, raised.value.instance_id) == (errors.BAD_REQUEST, 9)
        assert scripted.requests == []


class TestEmbed:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_vector_as_little_endian_float32(self, protocol):
        async with serve(protocol, servicer(protocol, embedding=[0.5, -0.25, 1.0])) as client:
            result = await client.embed("e", [1, 2, 3])
        assert result.dimensions == 3 and result.prompt_tokens == 3
        assert array.array("f", result.vector).tolist() == [0.5, -0.25, 1.0]
        assert result.vector == array.array("f", [0.5, -0.25, 1.0]).tobytes()

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_dimension_mismatch_is_an_engine_error(self, protocol):
        async with serve(protocol, servicer(protocol, embedding=[0.5], dim=4)) as client:
            with pytest.raises(EngineError) as raised:
                await client.embed("e", [1])
        assert raised.value.kind == errors.ENGINE_ERROR

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_status_becomes_its_kind(self, protocol):
        scripted = servicer(protocol, code=grpc.StatusCode.INVALID_ARGUMENT)
        async with serve(protocol, scripted) as client:
            with pytest.raises(EngineError) as raised:
                await client.embed("e", [1])
        assert raised.value.kind == errors.BAD_REQUEST


class TestModelKind:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    @pytest.mark.parametrize("embedding", [False, True])
    async def test_info_reports_is_generation(self, protocol, embedding):
        config = MockEngineConfig(protocol=protocol, port=0, embedding=embedding)
        async with start_mock_engine(config) as engine:
            client = client_for(protocol, f"grpc://{engine.target}", 1)
            try:
                info = await client.info(2.0)
            finally:
                await client.close()
        assert info.is_generation is not embedding
