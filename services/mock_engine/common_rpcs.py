"""The RPCs both engine families define with the shared common.proto messages (FlushCache,
GetTokenizer, SubscribeKvEvents), served the same way by both mock servicers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from smg_grpc_proto.generated import common_pb2

from switchyard.mock_engine.deps import tokenizer_slices
from switchyard.mock_engine.kv_grpc import kv_event_stream


class CommonRpcs:
    """Mixin: the servicer provides `engine` (MockEngine) and `deps` (ServicerDeps)."""

    engine: Any
    deps: Any

    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FlushCacheResponse:
        if self.engine.flush_cache():
            return common_pb2.FlushCacheResponse(success=True, message="Cache flushed successfully")
        return common_pb2.FlushCacheResponse(
            success=False, message="Cache not flushed: there are running requests"
        )

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        async for data, sha256 in tokenizer_slices(self.deps, context):
            yield common_pb2.GetTokenizerChunk(data=data, sha256=sha256)

    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        async for batch in kv_event_stream(self.deps.kv_events, request, context):
            yield batch
