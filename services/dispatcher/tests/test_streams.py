import asyncio

import pytest

from switchyard.common import errors
from switchyard.common.errors import EngineError
from switchyard.dispatcher.streams import run_generation
from switchyard.protos.messages import (
    GenerateFailed,
    GenerateFinished,
    GenerateRequest,
    SamplingParams,
    TokenDelta,
)

REQ = GenerateRequest(
    request_id="r1", instance_id=7, token_ids=[1, 2], sampling=SamplingParams(max_tokens=4)
)


class FakeEngine:
    """An EngineClient stand-in: replays a script, records aborts."""

    def __init__(self, events, error=None, hang=False):
        self.events, self.error, self.hang = events, error, hang
        self.aborted: list[str] = []

    async def generate(self, request):
        for event in self.events:
            yield event
        if self.hang:
            await asyncio.Event().wait()
        if self.error:
            raise self.error

    async def abort(self, request_id, timeout=2.0):
        self.aborted.append(request_id)


async def collect(engine):
    sent, down = [], []
    await run_generation(engine, REQ, sent.append, lambda *a: down.append(a))
    return sent, down


class TestRunGeneration:
    async def test_forwards_deltas_then_finished(self):
        done = GenerateFinished(
            request_id="r1", finish_reason="length", prompt_tokens=2, completion_tokens=2
        )
        sent, down = await collect(FakeEngine([TokenDelta("r1", [5]), TokenDelta("r1", [6]), done]))
        assert sent == [TokenDelta("r1", [5]), TokenDelta("r1", [6]), done]
        assert down == []

    @pytest.mark.parametrize(
        "kind,reports_down",
        [
            (errors.CANNOT_CONNECT, True),
            (errors.TIMEOUT, True),
            (errors.DISCONNECTED, False),
            (errors.OVERLOADED, False),
            (errors.BAD_REQUEST, False),
        ],
    )
    async def test_failure_becomes_one_failed_reply(self, kind, reports_down):
        engine = FakeEngine([TokenDelta("r1", [5])], error=EngineError(kind, "boom", 7))
        sent, down = await collect(engine)
        assert sent[0] == TokenDelta("r1", [5])
        assert sent[1] == GenerateFailed(request_id="r1", instance_id=7, kind=kind, message="boom")
        assert bool(down) == reports_down

    async def test_cancel_aborts_on_the_engine(self):
        engine = FakeEngine([TokenDelta("r1", [5])], hang=True)
        sent: list = []
        task = asyncio.create_task(run_generation(engine, REQ, sent.append, lambda *a: None))
        while not sent:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.aborted == ["r1"]
