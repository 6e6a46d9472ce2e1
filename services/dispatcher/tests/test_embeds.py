"""run_embed over a stand-in engine client: order, sub-request ids, failures."""

import asyncio

from switchyard.common import errors
from switchyard.common.engines.base import Embedding
from switchyard.common.errors import EngineError
from switchyard.dispatcher.embeds import run_embed
from switchyard.protos.messages import Embeddings, EmbedRequest, GenerateFailed


class FakeClient:
    def __init__(self, fail_on=None, kind=errors.BAD_REQUEST, dims=None):
        self.fail_on, self.kind, self.dims = fail_on, kind, dims or {}
        self.calls: list[str] = []
        self.cancelled: list[str] = []

    async def embed(self, request_id, token_ids, timeout=None, metadata=None):
        self.calls.append(request_id)
        self.metadata = metadata
        if token_ids == self.fail_on:
            raise EngineError(self.kind, "refused", 4)
        if token_ids == [0]:  # never answers: only cancellation ends it
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(request_id)
                raise
        await asyncio.sleep(0.001 * (5 - len(token_ids)))  # later inputs answer first
        dims = self.dims.get(len(token_ids), 2)
        return Embedding(bytes([len(token_ids)]) * 4 * dims, dims, len(token_ids))


async def run(client, inputs, rid="e"):
    sent, down = [], []
    request = EmbedRequest(request_id=rid, instance_id=4, inputs=inputs)
    await run_embed(client, request, sent.append, lambda *a: down.append(a))
    return sent, down


class TestRunEmbed:
    async def test_vectors_in_input_order_and_one_reply(self):
        client = FakeClient()
        sent, _ = await run(client, [[1], [1, 2], [1, 2, 3]])
        [reply] = sent
        assert isinstance(reply, Embeddings) and reply.prompt_tokens == 6
        assert [v[0] for v in reply.vectors] == [1, 2, 3] and reply.dimensions == 2
        assert sorted(client.calls) == ["e-0", "e-1", "e-2"]

    async def test_one_input_keeps_the_request_id(self):
        client = FakeClient()
        await run(client, [[1, 2]])
        assert client.calls == ["e"]

    async def test_first_failure_answers_and_cancels_the_rest(self):
        client = FakeClient(fail_on=[7])
        sent, down = await run(client, [[0], [7]])
        assert sent == [
            GenerateFailed(
                request_id="e", instance_id=4, kind=errors.BAD_REQUEST, message="refused"
            )
        ]
        assert client.cancelled == ["e-0"] and down == []

    async def test_unreachable_engine_is_reported_down(self):
        sent, down = await run(FakeClient(fail_on=[7], kind=errors.CANNOT_CONNECT), [[7]])
        assert sent[0].kind == errors.CANNOT_CONNECT and down == [
            (4, errors.CANNOT_CONNECT, "refused")
        ]

    async def test_an_engine_refusing_the_call_is_not_reported_down(self):
        """Regression (QA: one UNAVAILABLE answer took a whole engine out of rotation)."""
        sent, down = await run(FakeClient(fail_on=[7], kind=errors.REFUSED), [[7]])
        assert sent[0].kind == errors.REFUSED and down == []

    async def test_no_inputs_and_mixed_dimensions_fail(self):
        sent, _ = await run(FakeClient(), [])
        assert sent[0].kind == errors.BAD_REQUEST
        sent, _ = await run(FakeClient(dims={1: 2, 2: 3}), [[1], [1, 2]])
        assert sent[0].kind == errors.ENGINE_ERROR
