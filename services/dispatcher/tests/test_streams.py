import asyncio

import grpc
import msgspec
import pytest

from switchyard.common import errors
from switchyard.common.engines.connect import client_for
from switchyard.common.engines.sglang import SglangClient
from switchyard.common.errors import EngineError
from switchyard.dispatcher.streams import run_generation
from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import start_mock_engine
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
        self.closed = False

    async def stream_into(self, request, emit, relay=None):
        for event in self.events:
            emit(event)
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
            # the engine refused this one call: migrate, the engine stays in rotation
            (errors.REFUSED, False),
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


class TestNoSilentDeath:
    """Issue 14: an exception run_generation did not foresee killed its task without a reply,
    and the client waited for the idle timeout."""

    async def test_an_unexpected_exception_becomes_one_engine_error_reply(self, caplog):
        engine = FakeEngine([TokenDelta("r1", [5])], error=RuntimeError("bug"))
        sent, down, kinds = [], [], []
        await run_generation(engine, REQ, sent.append, lambda *a: down.append(a), kinds.append)
        assert sent[0] == TokenDelta("r1", [5])
        assert isinstance(sent[1], GenerateFailed) and sent[1].kind == errors.ENGINE_ERROR
        assert "RuntimeError: bug" in sent[1].message
        assert kinds == [errors.ENGINE_ERROR] and down == []
        logged = [r for r in caplog.records if "unexpectedly" in r.getMessage()]
        assert len(logged) == 1 and "request_id=r1" in logged[0].getMessage()
        assert logged[0].exc_info is not None

    async def test_a_value_the_engine_protocol_cannot_hold_is_a_bad_request(self):
        """top_k >= 2^31 does not fit SGLang's int32 field: build_request raises."""
        channel = grpc.aio.insecure_channel("127.0.0.1:1")  # never dialled
        client = SglangClient(channel, 7)
        huge = msgspec.structs.replace(REQ.sampling, top_k=2**31)
        request = msgspec.structs.replace(REQ, sampling=huge)
        sent: list = []
        await run_generation(client, request, sent.append, lambda *a: None)
        await channel.close()
        assert len(sent) == 1 and sent[0].kind == errors.BAD_REQUEST
        assert "top_k" in sent[0].message or "cannot take" in sent[0].message


class TestChannelClosedUnderAStream:
    """Issue 11/14: closing a channel under a running stream cancels its call; that must
    read as a migratable failure, not as the caller going away."""

    async def test_a_channel_closed_mid_stream_fails_the_stream_as_disconnected(self):
        config = MockEngineConfig(protocol="sglang", port=0, itl_ms=5.0)
        async with start_mock_engine(config) as engine:
            client = client_for("sglang", f"grpc://{engine.target}", 7)
            sampling = SamplingParams(max_tokens=100_000, ignore_eos=True)
            request = msgspec.structs.replace(REQ, sampling=sampling)
            sent: list = []
            task = asyncio.create_task(run_generation(client, request, sent.append, print))
            async with asyncio.timeout(30):
                while not sent:
                    await asyncio.sleep(0.01)
                await client.close()
                await task  # ends, with a reply, instead of raising CancelledError
            assert isinstance(sent[-1], GenerateFailed)
            assert sent[-1].kind == errors.DISCONNECTED
            assert errors.DISCONNECTED in errors.MIGRATABLE
            # And a call on the closed channel fails the same way.
            again: list = []
            await run_generation(client, request, again.append, print)
            assert again[-1].kind == errors.DISCONNECTED

    async def test_whatever_a_closed_channel_raises_is_disconnected(self):
        """Issue 11: a task on a closed channel died with UsageError('Channel is closed.')
        and sent no failure; whatever the exception, a closed client means migrate now."""
        engine = FakeEngine([TokenDelta("r1", [5])], error=RuntimeError("Channel is closed."))
        engine.closed = True
        sent: list = []
        await run_generation(engine, REQ, sent.append, print)
        assert isinstance(sent[-1], GenerateFailed) and sent[-1].kind == errors.DISCONNECTED
        assert errors.DISCONNECTED in errors.MIGRATABLE
