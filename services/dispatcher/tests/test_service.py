"""The dispatcher process end to end in-process: a real fleet, real ZMQ (a DEALER as the
preprocessor), real gRPC to mock engines. Embed requests, logprobs, n choices and a refused
field travel through the same ROUTER channel as generations."""

from __future__ import annotations

import array
import asyncio
import contextlib
import math
from collections import defaultdict, deque
from collections.abc import AsyncIterator

import msgspec
import pytest
import zmq
import zmq.asyncio
from support.mock_engine import wait_until

from switchyard.common import errors
from switchyard.common.engines import frames
from switchyard.common.fleet_client import FleetClient
from switchyard.common.instance_id import instance_id
from switchyard.common.ports import free_port
from switchyard.common.workers import WorkerSpec
from switchyard.dispatcher.service import DispatcherService
from switchyard.fleet.service import FleetService
from switchyard.fleet.source import WorkerSource
from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import MockEngineServer, start_mock_engine
from switchyard.protos import codec
from switchyard.protos.messages import (
    CancelRequest,
    Embeddings,
    EmbedRequest,
    GenerateFailed,
    GenerateFinished,
    GenerateRequest,
    SamplingParams,
    TokenDelta,
)


def endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


class Stack:
    def __init__(
        self,
        dealer: zmq.asyncio.Socket,
        ids: dict[str, int],
        engines: dict[str, MockEngineServer],
        dispatcher: DispatcherService,
    ) -> None:
        self.dealer = dealer
        self.dispatcher = dispatcher
        self.ids = ids  # "generation" / "embedding" -> instance id
        self.engines = engines  # the MockEngineServers, by the same names
        # Replies read but not yet returned, by request id.
        self.inbox: defaultdict[str, deque[object]] = defaultdict(deque)

    async def send(self, message: object) -> None:
        await self.dealer.send_multipart([codec.encode(message)])

    async def replies(self, request_id: str, until: type, count: int = 1) -> list[object]:
        """This request's replies up to the `count`-th reply of type `until` (or a failure).

        Every reply read is kept until a call for its request takes it: one message carries
        the replies of several requests (the dispatcher sends what its reply window
        gathered), and another request's finish after this one's in the same message used
        to be dropped, so waiting for it then failed with "no reply for b"."""
        got: list[object] = []
        seen = 0
        inbox = self.inbox[request_id]
        while True:
            while inbox:
                reply = inbox.popleft()
                got.append(reply)
                if isinstance(reply, GenerateFailed):
                    return got
                if isinstance(reply, until):
                    seen += 1
                    if seen == count:
                        return got
            if not await self.dealer.poll(15_000):
                raise TimeoutError(f"no reply for {request_id}")
            [data] = await self.dealer.recv_multipart()
            for reply in codec.dispatcher_replies.decode(data):
                rid = getattr(reply, "request_id", None)
                if rid is not None:
                    self.inbox[rid].append(reply)


@contextlib.asynccontextmanager
async def stack() -> AsyncIterator[Stack]:
    generation = MockEngineConfig(protocol="sglang", port=0, speedup=1000.0, context_length=512)
    embedding = MockEngineConfig(
        protocol="vllm", port=0, speedup=1000.0, embedding=True, embedding_dim=32
    )
    async with start_mock_engine(generation) as gen, start_mock_engine(embedding) as emb:
        urls = {"generation": f"grpc://{gen.target}", "embedding": f"grpc://{emb.target}"}
        control, events, bind = endpoint(), endpoint(), endpoint()
        fleet = FleetService(
            WorkerSource([WorkerSpec(url) for url in urls.values()]),
            control=control,
            events=events,
            probe_interval=0.2,
            probe_timeout=2.0,
        )
        await fleet.start()
        watcher = FleetClient(control, events)
        dispatcher = DispatcherService(bind, control, events)
        stop = asyncio.Event()
        context = zmq.asyncio.Context()
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        running = None
        try:
            await watcher.start(timeout=10)
            deadline = asyncio.get_running_loop().time() + 10
            while len(watcher.instances) < 2:  # both engines probed
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError("fleet did not list both engines")
                await asyncio.sleep(0.05)
            running = asyncio.create_task(dispatcher.run(stop))
            while len(dispatcher.pool) < 2:
                if running.done():
                    running.result()
                await asyncio.sleep(0.05)
            dealer.connect(bind)
            ids = {name: instance_id(url) for name, url in urls.items()}
            kinds = {i.instance_id: i.is_generation for i in watcher.instances.values()}
            assert kinds == {ids["generation"]: True, ids["embedding"]: False}
            yield Stack(dealer, ids, {"generation": gen, "embedding": emb}, dispatcher)
        finally:
            stop.set()
            if running is not None:
                await running
            dealer.close()
            context.term()
            await watcher.close()
            await fleet.close()


@pytest.fixture
async def dispatcher_stack() -> AsyncIterator[Stack]:
    async with stack() as s:
        yield s


def generate(stack: Stack, rid: str, **fields: object) -> GenerateRequest:
    sampling = fields.pop(
        "sampling", SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    )
    return GenerateRequest(
        request_id=rid,
        instance_id=stack.ids["generation"],
        token_ids=[100, 200, 300, 400],
        sampling=sampling,  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


class TestEmbed:
    async def test_one_reply_with_every_vector(self, dispatcher_stack: Stack) -> None:
        s = dispatcher_stack
        inputs = [[100, 200, 300], [400, 500], [100, 200, 300]]
        await s.send(EmbedRequest(request_id="e1", instance_id=s.ids["embedding"], inputs=inputs))
        [reply] = await s.replies("e1", Embeddings)
        assert isinstance(reply, Embeddings)
        assert reply.dimensions == 32 and reply.prompt_tokens == 8 and len(reply.vectors) == 3
        vectors = [array.array("f", v).tolist() for v in reply.vectors]
        assert all(len(v) == 32 for v in vectors)
        assert math.isclose(sum(x * x for x in vectors[0]), 1.0, rel_tol=1e-5)
        assert vectors[0] == vectors[2] != vectors[1]  # deterministic per input

    async def test_a_generation_instance_refuses_embed(self, dispatcher_stack: Stack) -> None:
        s = dispatcher_stack
        await s.send(EmbedRequest(request_id="e2", instance_id=s.ids["generation"], inputs=[[1]]))
        [reply] = await s.replies("e2", Embeddings)
        assert isinstance(reply, GenerateFailed) and reply.kind == errors.BAD_REQUEST

    async def test_a_bad_input_fails_the_whole_request(self, dispatcher_stack: Stack) -> None:
        s = dispatcher_stack
        await s.send(
            EmbedRequest(request_id="e3", instance_id=s.ids["embedding"], inputs=[[5], []])
        )
        [reply] = await s.replies("e3", Embeddings)
        assert isinstance(reply, GenerateFailed) and reply.kind == errors.BAD_REQUEST

    async def test_an_embedding_instance_refuses_generate(self, dispatcher_stack: Stack) -> None:
        s = dispatcher_stack
        request = msgspec.structs.replace(generate(s, "g-emb"), instance_id=s.ids["embedding"])
        await s.send(request)
        [reply] = await s.replies("g-emb", GenerateFinished)
        assert isinstance(reply, GenerateFailed) and reply.kind == errors.BAD_REQUEST
        assert "does not support generation" in reply.message


class TestGenerateExtras:
    async def test_logprobs_and_prompt_logprobs(self, dispatcher_stack: Stack) -> None:
        s = dispatcher_stack
        await s.send(generate(s, "lp", logprobs=2, prompt_logprobs=1))
        replies = await s.replies("lp", GenerateFinished)
        deltas = [r for r in replies if isinstance(r, TokenDelta)]
        assert sum(len(d.token_ids) for d in deltas) == 6
        assert deltas[0].prompt_logprobs is not None
        assert len(deltas[0].prompt_logprobs.logprobs) == 4
        assert deltas[0].prompt_logprobs.logprobs[0] is None
        assert all(d.prompt_logprobs is None for d in deltas[1:])
        for delta in deltas:
            assert delta.logprobs is not None
            assert len(delta.logprobs.logprobs) == len(delta.token_ids)
            assert [top[0] for top in delta.logprobs.top_ids] == delta.token_ids
            assert all(len(top) == 2 for top in delta.logprobs.top_ids)

    async def test_n_choices_end_with_one_finish_each(self, dispatcher_stack: Stack) -> None:
        s = dispatcher_stack
        sampling = SamplingParams(max_tokens=5, temperature=1.0, n=3, ignore_eos=True)
        await s.send(generate(s, "n3", sampling=sampling))
        replies = await s.replies("n3", GenerateFinished, count=3)
        finished = [r for r in replies if isinstance(r, GenerateFinished)]
        assert sorted(f.index for f in finished) == [0, 1, 2]
        assert all(f.completion_tokens == 5 for f in finished)
        outputs: dict[int, list[int]] = {}
        for r in replies:
            if isinstance(r, TokenDelta):
                outputs.setdefault(r.index, []).extend(r.token_ids)
        assert sorted(outputs) == [0, 1, 2] and len({tuple(o) for o in outputs.values()}) == 3

    async def test_a_field_sglang_cannot_carry_is_a_bad_request(
        self, dispatcher_stack: Stack
    ) -> None:
        s = dispatcher_stack
        sampling = SamplingParams(max_tokens=5, seed=3)
        await s.send(generate(s, "seeded", sampling=sampling))
        [reply] = await s.replies("seeded", GenerateFinished)
        assert isinstance(reply, GenerateFailed) and reply.kind == errors.BAD_REQUEST
        assert "seed" in reply.message

    async def test_cancel_stops_an_n_request(self, dispatcher_stack: Stack) -> None:
        s = dispatcher_stack
        sampling = SamplingParams(max_tokens=100000, temperature=1.0, n=2, ignore_eos=True)
        await s.send(generate(s, "long", sampling=sampling))
        [first] = await s.replies("long", TokenDelta)
        assert isinstance(first, TokenDelta)
        await s.send(CancelRequest("long"))
        await s.send(generate(s, "after"))  # the channel keeps serving
        replies = await s.replies("after", GenerateFinished)
        assert isinstance(replies[-1], GenerateFinished)
        await wait_until(lambda: s.engines["generation"].engine.active_requests == 0)


class TestRelayedStreams:
    """Streamed plain requests: the engine connection's frame reader writes their token chunks
    into the outbox itself (frames.py; with the C extension, else the Python path)."""

    async def test_the_same_replies_as_the_decoded_path(self, dispatcher_stack: Stack) -> None:
        s = dispatcher_stack
        sampling = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        await s.send([generate(s, f"p{i}", sampling=sampling) for i in range(4)])
        # logprobs go the decoded way (base.EngineClient._generate_detailed), never relayed
        await s.send(generate(s, "decoded", sampling=sampling, logprobs=0))
        outputs = {}
        for rid in ("p0", "p1", "p2", "p3", "decoded"):
            replies = await s.replies(rid, GenerateFinished)
            [finished] = [r for r in replies if isinstance(r, GenerateFinished)]
            ids = [t for r in replies if isinstance(r, TokenDelta) for t in r.token_ids]
            assert finished.completion_tokens == len(ids) == 40
            assert isinstance(replies[-1], GenerateFinished)
            outputs[rid] = ids
        assert len({tuple(ids) for ids in outputs.values()}) == 1  # greedy: all alike
        client = s.dispatcher.pool.get(s.ids["generation"])
        assert client is not None and client.streams is not None
        conn = client.streams._conn
        assert conn is not None
        assert (conn._reader.relayed > 0) == frames.NATIVE

    async def test_the_engine_ttft_is_timed_once_per_stream(self, dispatcher_stack: Stack) -> None:
        s = dispatcher_stack
        worker = s.dispatcher._worker_of(s.ids["generation"])
        series = s.dispatcher.metrics.engine_ttft.labels(*worker)
        before = sum(series.counts)
        await s.send([generate(s, f"t{i}") for i in range(3)])
        for i in range(3):
            await s.replies(f"t{i}", GenerateFinished)
        assert sum(series.counts) - before == 3

    async def test_relayed_replies_count_as_activity(self, dispatcher_stack: Stack) -> None:
        s = dispatcher_stack
        stall = s.dispatcher.stall
        assert stall is not None
        activity = stall.activity(s.ids["generation"], 0.0)
        before = activity.replies
        await s.send(generate(s, "active"))
        replies = await s.replies("active", GenerateFinished)
        assert activity.replies - before == len(replies) >= 2  # token chunks, the final one


class TestBatchedRequests:
    async def test_a_list_of_requests_in_one_message_is_taken_in_order(
        self, dispatcher_stack: Stack
    ) -> None:
        """What a preprocessor had in one loop iteration comes as one list: each starts, and a
        cancel after its generation in the list stops it."""
        s = dispatcher_stack
        sampling = SamplingParams(max_tokens=100000, temperature=1.0, ignore_eos=True)
        await s.send([generate(s, "a"), generate(s, "gone", sampling=sampling), generate(s, "b")])
        for rid in ("a", "b"):
            assert isinstance((await s.replies(rid, GenerateFinished))[-1], GenerateFinished)
        [first] = await s.replies("gone", TokenDelta)
        assert isinstance(first, TokenDelta)
        await s.send([CancelRequest("gone"), generate(s, "c")])
        assert isinstance((await s.replies("c", GenerateFinished))[-1], GenerateFinished)
        await wait_until(lambda: s.engines["generation"].engine.active_requests == 0)
