"""The embed stage over fake router/dispatcher clients: migration on faults."""

from __future__ import annotations

import pytest

from switchyard.common import errors
from switchyard.preprocessor.stages.context import EMBEDDINGS
from switchyard.preprocessor.stages.embed import embed
from switchyard.preprocessor.stages.endpoints import new_request, parse
from switchyard.preprocessor.stages.tests.fakes import (
    MODEL,
    FakeDispatcher,
    FakeHttp,
    FakeRouter,
    deps,
    failed,
)
from switchyard.protos.messages import Embeddings

pytestmark = pytest.mark.timeout(30)


async def test_engines_that_refused_are_tried_again_when_none_is_left(bundle):
    """A refusal (an engine's own UNAVAILABLE to one call) is a moment, not a fault: once
    every engine refused, they are tried again rather than the request failing."""
    calls: list[int] = []

    def script(req):
        calls.append(req.instance_id)
        if len(calls) <= 2:
            return [failed(req.request_id, req.instance_id, errors.REFUSED)]
        return [
            Embeddings(
                request_id=req.request_id, dimensions=1, vectors=[b"\0\0\0\0"], prompt_tokens=1
            )
        ]

    router = FakeRouter([1, 2])
    d = deps(bundle, router, FakeDispatcher(script))
    ctx = new_request(d, EMBEDDINGS, FakeHttp())
    ctx.raw = b'{"model": "%s", "input": "hi"}' % MODEL.encode()
    parse(ctx)
    ctx.prompt_ids = [[5, 6]]
    await embed(ctx)
    result = ctx.extra["embeddings"]
    assert result.dimensions == 1 and calls == [1, 2, 1]
    # the third route excluded both, found none, and was asked again excluding neither
    assert router.excluded == [[], [1], [1, 2], []]
