"""Pipeline.generate against fake router and dispatcher clients."""

from __future__ import annotations

import asyncio

from switchyard.preprocessor.pipeline import GenerationInput, Pipeline
from switchyard.protos.messages import (
    GenerateFailed,
    GenerateFinished,
    RouteResponse,
    SamplingParams,
    TokenDelta,
)


class FakeRouter:
    def __init__(self, instances: list[int]) -> None:
        self.instances = instances
        self.excluded: list[list[int]] = []

    async def route(self, request, timeout):
        self.excluded.append(list(request.exclude))
        free = [i for i in self.instances if i not in request.exclude]
        return RouteResponse(
            request_id=request.request_id,
            instance_id=free[0] if free else None,
            error="" if free else "no_worker",
        )

    async def progress(self, *args, **kwargs) -> None:
        pass

    async def busy(self, *args) -> None:
        pass


class FakeStream:
    def __init__(self, replies) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        for reply in replies:
            self.queue.put_nowait(reply)

    async def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeDispatcher:
    def __init__(self, script) -> None:
        self.script = script
        self.requests = []

    async def open(self, request):
        self.requests.append(request)
        return FakeStream(self.script(request))


INPUT = GenerationInput("r", "m", [1, 2, 3], SamplingParams(max_tokens=5, min_tokens=2))


def done(rid: str) -> GenerateFinished:
    return GenerateFinished(
        request_id=rid, finish_reason="length", prompt_tokens=0, completion_tokens=0
    )


async def collect(pipeline: Pipeline) -> list:
    return [item async for item in pipeline.generate(INPUT)]


class TestCoalescing:
    async def test_deltas_already_queued_come_out_as_one(self):
        """Regression guard for the per-token path: a caller that fell behind gets one
        merged delta, and the final message still follows."""
        dispatcher = FakeDispatcher(
            lambda req: [
                TokenDelta("r", [7]),
                TokenDelta("r", [8]),
                TokenDelta("r", [9]),
                done("r"),
            ]
        )
        items = await collect(Pipeline(FakeRouter([1]), dispatcher))
        assert items[0] == TokenDelta("r", [7, 8, 9])
        assert type(items[1]) is GenerateFinished
        assert items[1].completion_tokens == 3
        assert items[1].prompt_tokens == 3


class TestMigration:
    async def test_resends_prompt_plus_generated_with_reduced_budget(self):
        def script(req):
            if req.instance_id == 1:
                return [
                    TokenDelta(req.request_id, [7]),
                    GenerateFailed(
                        request_id=req.request_id,
                        instance_id=1,
                        kind="cannot_connect",
                        message="gone",
                    ),
                ]
            return [TokenDelta(req.request_id, [8, 9]), done(req.request_id)]

        router, dispatcher = FakeRouter([1, 2]), FakeDispatcher(script)
        items = await collect(Pipeline(router, dispatcher))
        assert [i.token_ids for i in items if type(i) is TokenDelta] == [[7], [8, 9]]
        retry = dispatcher.requests[1]
        assert retry.token_ids == [1, 2, 3, 7]
        assert (retry.sampling.max_tokens, retry.sampling.min_tokens) == (4, 1)
        assert router.excluded == [[], [1]]
        assert items[-1].completion_tokens == 3

    async def test_dispatcher_loss_does_not_exclude_the_engine(self):
        calls = []

        def script(req):
            calls.append(req.instance_id)
            if len(calls) == 1:
                return [
                    GenerateFailed(
                        request_id=req.request_id,
                        instance_id=1,
                        kind="disconnected",
                        message="dispatcher went away",
                        engine_fault=False,
                    )
                ]
            return [TokenDelta(req.request_id, [8]), done(req.request_id)]

        router = FakeRouter([1])
        items = await collect(Pipeline(router, FakeDispatcher(script)))
        assert calls == [1, 1]
        assert router.excluded == [[], []]
        assert items[-1].completion_tokens == 1


class TestTimeouts:
    """Issue 14: a frozen engine stalled its streams for the whole first-token idle timeout;
    once tokens flow, the (short) gap timeout applies instead."""

    async def test_a_silent_stream_after_its_first_token_migrates_after_the_gap_timeout(self):
        def script(req):
            if req.request_id == "r":  # the first attempt: one token, then silence
                return [TokenDelta("r", [7])]
            return [TokenDelta(req.request_id, [8, 9, 10, 11]), done(req.request_id)]

        dispatcher = FakeDispatcher(script)
        pipeline = Pipeline(FakeRouter([1, 2]), dispatcher, idle_timeout=60.0, gap_timeout=0.05)
        async with asyncio.timeout(10):  # bounded: the 60 s idle timeout never applies
            items = await collect(pipeline)
        tokens = [t for item in items if isinstance(item, TokenDelta) for t in item.token_ids]
        assert tokens == [7, 8, 9, 10, 11]
        assert dispatcher.requests[1].token_ids == [1, 2, 3, 7]  # prompt + tokens so far
        assert isinstance(items[-1], GenerateFinished)

    async def test_the_first_token_may_take_up_to_the_idle_timeout(self):
        class SlowStart(FakeStream):
            def __init__(self, request_id):
                super().__init__([])

                async def later():
                    await asyncio.sleep(0.3)  # longer than the gap timeout
                    self.queue.put_nowait(TokenDelta(request_id, [5]))
                    self.queue.put_nowait(done(request_id))

                self.task = asyncio.ensure_future(later())

        class Dispatcher(FakeDispatcher):
            async def open(self, request):
                self.requests.append(request)
                return SlowStart(request.request_id)

        dispatcher = Dispatcher(None)
        pipeline = Pipeline(FakeRouter([1]), dispatcher, idle_timeout=30.0, gap_timeout=0.05)
        items = await collect(pipeline)
        assert len(dispatcher.requests) == 1  # no migration
        assert isinstance(items[-1], GenerateFinished)
