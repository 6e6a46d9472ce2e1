"""Replies to the preprocessors, batched per peer: per event-loop iteration, and under load
per reply window.

Each reply is queued for its peer, encoded, in the peer's ReplyBatch (frames.py), and one
flush sends every peer one ZMQ message holding all its replies (a msgpack array): one send per
peer instead of one per token, so fewer syscalls here and fewer wake-ups and reads in the
preprocessor. The engine connections' frame readers write streamed token chunks into the
same batches themselves (a Relay, engines/http2.py), then call `schedule()`.

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

from switchyard.common.engines.frames import PyReplyBatch, ReplyBatch
from switchyard.common.messaging import LoopSocket
from switchyard.dispatcher.metrics import DispatcherMetrics
from switchyard.protos.codec import encode

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
        self._batches: dict[bytes, PyReplyBatch] = {}  # or the C form, alike
        self._due = False  # a flush is scheduled
        self._loop = asyncio.get_running_loop()
        self._window = window
        self._flushed_at = -window  # loop time of the last flush

    def batch(self, peer: bytes) -> PyReplyBatch:
        """The peer's batch: replies written into it (a relay's token chunks, frames.py) go
        out with the next flush, once `schedule()` was called."""
        batch = self._batches.get(peer)
        if batch is None:
            batch = self._batches[peer] = ReplyBatch()
        return batch

    def post(self, peer: bytes, reply: object) -> None:
        self.batch(peer).append(encode(reply))
        if not self._due:
            self.schedule()

    def schedule(self) -> None:
        """Flush on the next loop iteration, or once the window since the last flush ends."""
        if self._due:
            return
        self._due = True
        loop = self._loop
        due = self._flushed_at + self._window
        if loop.time() < due:
            loop.call_at(due, self.flush)
        else:
            loop.call_soon(self.flush)

    def flush(self) -> None:
        self._due = False
        self._flushed_at = self._loop.time()
        send = self._sock.send_multipart
        messages = replies = 0
        gone = []
        for peer, batch in self._batches.items():
            count = batch.count
            data = batch.take()
            if data is None:
                continue
            messages += 1
            replies += count
            try:
                send([peer, data])
            except zmq.ZMQError as exc:  # the preprocessor went away (ROUTER_MANDATORY)
                log.debug("replies to a gone peer dropped: %s", exc)
                gone.append(peer)
        if self._metrics is not None and messages:
            self._metrics.messages.inc(messages)
            self._metrics.replies.inc(replies)
        for peer in gone:
            del self._batches[peer]
            self._on_peer_gone(peer)
