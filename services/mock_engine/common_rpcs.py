"""The RPCs both engine families define with the shared common.proto messages (FlushCache,
GetTokenizer, SubscribeKvEvents), served the same way by both mock servicers, and the body of
Embed, which both serve alike but for their own messages and error strings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from smg_grpc_proto.generated import common_pb2

from switchyard.mock_engine.config import MAX_RUNNING_REQUESTS
from switchyard.mock_engine.deps import log_request, tokenizer_slices
from switchyard.mock_engine.errors import RequestRejected
from switchyard.mock_engine.kv_grpc import kv_event_stream, load_record


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
        # The stock servicers relay the engine's ZMQ publisher: none configured, none to relay.
        if self.deps.config.kv_events_endpoint is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "KV cache events not enabled. Start the mock engine with --kv-events-endpoint",
            )
        engine = self.engine

        def load_of(rank: int) -> common_pb2.EngineLoad:
            return load_record(engine.ranks[rank].loads(), MAX_RUNNING_REQUESTS)

        publishers = self.deps.kv_publishers or (self.deps.kv_events,)
        async for batch in kv_event_stream(publishers, request, context, load_of):
            yield batch

    async def _embed(
        self,
        request: Any,
        context: grpc.aio.ServicerContext,
        response: Any,
        not_embedding: str,
        not_tokenized: str,
    ) -> Any:
        """Embed for either family: `response` is its EmbedResponse class, the two strings
        its engine's INVALID_ARGUMENT messages (a generation model; no tokenized input)."""
        if not self.deps.config.embedding:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, not_embedding)
        if not request.HasField("tokenized"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, not_tokenized)
        request_id = request.request_id or self.engine.new_request_id()
        log_request(self.deps, "Embed", request_id, context)
        prompt = tuple(request.tokenized.input_ids)
        try:
            vector = await self.deps.embed(request_id, prompt)
        except RequestRejected as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.reason)
        return response(embedding=vector, prompt_tokens=len(prompt), embedding_dim=len(vector))
