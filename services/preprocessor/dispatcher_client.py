"""The preprocessor's side of the dispatcher channel.

One DEALER per dispatcher replica; each generation stays on the replica it started on (its
cancel must reach the same one). Replies are fanned out to per-request queues by the reader.
When a replica's connection drops, every stream it carried is failed at once (kind
`disconnected`, not the engine's fault), so the pipeline migrates them through another
replica instead of waiting for the idle timeout. A frozen replica (SIGSTOP, a hung host)
keeps its connection open: the ZMQ heartbeat drops it after HEARTBEAT_S without an answer.
That is what moves a request asked of its engine whole, which no stream timeout watches.

The replicas are a `replicas.ReplicaSet`: each `--dispatcher` endpoint, and every address a
dispatcher name resolves to (a compose service, a Kubernetes headless Service), followed as the
name's addresses change. A retired replica (its address gone from the name) starts no new
generation; its running streams finish there, and it is closed once none is left.

`open` waits (up to `wait_s`) for a replica to be connected: while the only dispatcher
restarts (`switchyard up` restarts a crashed child after a backoff of up to 10 s, then it
starts up), a new or migrating stream waits for it instead of failing.
"""

from __future__ import annotations

from typing import Any

from switchyard.common import errors
from switchyard.common.messaging import DealerClient
from switchyard.common.replicas import RESOLVE_INTERVAL_S, ReplicaSet, Resolve, resolve_ipv4
from switchyard.preprocessor.reply_queue import ReplyQueue
from switchyard.protos import codec
from switchyard.protos.messages import (
    CancelRequest,
    EmbedRequest,
    GenerateFailed,
    GenerateRequest,
)


class NoDispatcher(errors.SwitchyardError):
    """No dispatcher replica is connected."""


HEARTBEAT_S = 4.0  # as the dispatcher's own stall timeout (an engine silent on every stream)


class _Replica(DealerClient):
    def __init__(self, endpoint: str, streams: dict[str, GenerationStream]) -> None:
        # A generation's start goes at once; cancels are batched (messaging.DealerClient).
        super().__init__(
            endpoint,
            codec.dispatcher_replies,
            urgent=(GenerateRequest, EmbedRequest),
            heartbeat=HEARTBEAT_S,
        )
        self._all = streams
        self.streams: set[str] = set()  # request ids of the streams on this replica

    def handle(self, replies: Any) -> None:
        # One message carries every reply the dispatcher had for us in one loop iteration.
        streams = self._all
        for reply in replies:
            stream = streams.get(reply.request_id)
            if stream is not None:
                stream.queue.put_nowait(reply)

    def on_disconnect(self) -> None:
        for request_id in list(self.streams):
            stream = self._all.get(request_id)
            if stream is not None:
                stream.queue.put_nowait(
                    GenerateFailed(
                        request_id=request_id,
                        instance_id=stream.instance_id,
                        kind=errors.DISCONNECTED,
                        engine_fault=False,
                        message=f"dispatcher {self.endpoint} went away",
                    )
                )


class GenerationStream:
    """Replies of one generation: TokenDelta..., then GenerateFinished or GenerateFailed, put
    in `queue` (its own, or one the caller shares between several generations)."""

    def __init__(
        self,
        client: DispatcherClient,
        replica: _Replica,
        request: GenerateRequest | EmbedRequest,
        queue: ReplyQueue | None = None,
    ):
        self._client = client
        self._replica = replica
        self.request_id = request.request_id
        self.instance_id = request.instance_id
        self.queue = queue if queue is not None else ReplyQueue()
        self._open = True

    async def cancel(self) -> None:
        if self._open:
            self.close()
            if self._replica.connected:
                self._replica.send_now(CancelRequest(self.request_id))

    def close(self) -> None:
        if self._open:
            self._open = False
            self._client.streams.pop(self.request_id, None)
            self._replica.streams.discard(self.request_id)


DEFAULT_WAIT_S = 30.0  # longer than `up`'s longest restart backoff (10 s) plus a start-up


class DispatcherClient:
    def __init__(
        self,
        endpoints: list[str],
        wait_s: float = DEFAULT_WAIT_S,
        *,
        resolve: Resolve = resolve_ipv4,
        resolve_interval: float = RESOLVE_INTERVAL_S,
    ) -> None:
        if wait_s < 0:
            raise ValueError("the dispatcher wait must be >= 0")
        self.wait_s = wait_s
        self.streams: dict[str, GenerationStream] = {}
        self.replicas = ReplicaSet(
            endpoints,
            lambda address: _Replica(address, self.streams),
            lambda replica: bool(replica.streams),
            what="dispatcher",
            resolve=resolve,
            interval=resolve_interval,
        )
        self._turn = 0

    def start(self) -> None:
        self.replicas.start()

    def connected(self) -> bool:
        """Some replica is connected now."""
        return self.replicas.connected()

    async def wait_connected(self, timeout: float) -> bool:
        """True once any replica is connected (at once when one is); False after `timeout`."""
        return await self.replicas.wait_connected(timeout)

    def _pick(self) -> _Replica:
        replicas = self.replicas.live
        if replicas:
            first = self._turn % len(replicas)
            self._turn += 1
            for replica in replicas[first:] + replicas[:first]:
                if replica.connected:
                    return replica
        raise NoDispatcher("no dispatcher is connected")

    async def open(
        self, request: GenerateRequest | EmbedRequest, queue: ReplyQueue | None = None
    ) -> GenerationStream:
        """Start a generation on a connected replica; NoDispatcher when none is connected
        within `wait_s`."""
        try:
            replica = self._pick()
        except NoDispatcher:
            self.replicas.resolve_soon()  # maybe they moved
            if not await self.wait_connected(self.wait_s):
                raise NoDispatcher(
                    f"no dispatcher is reachable (waited {self.wait_s:g}s)"
                ) from None
            replica = self._pick()
        stream = GenerationStream(self, replica, request, queue)
        self.streams[request.request_id] = stream
        replica.streams.add(request.request_id)
        replica.send_now(request)
        return stream

    async def close(self) -> None:
        await self.replicas.close()
