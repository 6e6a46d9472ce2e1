"""Replies to the preprocessors, batched per peer: per event-loop iteration, and under load
per reply window.

Each reply is queued for its peer, and one flush sends every peer one ZMQ message holding all
its replies (a msgpack array): one send per peer instead of one per token, so fewer syscalls
here and fewer wake-ups and reads in the preprocessor.

When the flush runs: an engine's decode step gives every running request its next token at
once, but the step's replies reach the dispatcher spread over a fraction of a millisecond (the
engine writes each stream on its own), so flushing on the next loop iteration alone sends
only a few replies per message. After a flush, the next one waits until `window` seconds
have passed since it; an idle dispatcher (the last flush longer ago than that) flushes on the
next iteration, so a lone stream's tokens, which come an inter-token latency apart, wait for
nothing. What the window gains: docs/benchmarks.md, "Reply batching".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq

from switchyard.common.messaging import LoopSocket
from switchyard.dispatcher.metrics import DispatcherMetrics
from switchyard.protos import codec

log = logging.getLogger(__name__)


class Outbox:
    def __init__(
        self,
        sock: LoopSocket,
        on_peer_gone: Callable[[bytes], None],
        metrics: DispatcherMetrics | None = None,
        window: float = 0.0,
    ) -> None:
        if window < 0:
            raise ValueError(f"the reply window must be >= 0, got {window}")
        self._sock = sock
        self._on_peer_gone = on_peer_gone
        self._metrics = metrics
        self._pending: dict[bytes, list[object]] = {}
        self._loop = asyncio.get_running_loop()
        self._window = window
        self._flushed_at = -window  # loop time of the last flush

    def post(self, peer: bytes, reply: object) -> None:
        pending = self._pending
        if not pending:
            loop = self._loop
            due = self._flushed_at + self._window
            if loop.time() < due:
                loop.call_at(due, self.flush)
            else:
                loop.call_soon(self.flush)
        batch = pending.get(peer)
        if batch is None:
            pending[peer] = [reply]
        else:
            batch.append(reply)

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        self._flushed_at = self._loop.time()
        if self._metrics is not None:
            self._metrics.messages.inc(len(pending))
            self._metrics.replies.inc(sum(len(replies) for replies in pending.values()))
        encode = codec.encode
        send = self._sock.send_multipart
        for peer, replies in pending.items():
            try:
                send([peer, encode(replies)])
            except zmq.ZMQError as exc:  # the preprocessor went away (ROUTER_MANDATORY)
                log.debug("replies to a gone peer dropped: %s", exc)
                self._on_peer_gone(peer)
