"""One publisher's batches (an engine's data-parallel rank): sequence rules and replay resync,
whatever transport delivers them (a SUB connected to the engine, or the router's bound SUB).

Sequence rules (`last` is the last sequence applied):
    first message, seq 0          apply
    first message, seq > 0        late join: replay [0, seq), then apply
    seq == last + 1               apply
    seq > last + 1                gap: replay [last + 1, seq), then apply
    seq <= last                   reset (the engine restarted, its cache is empty): clear the
                                  worker, replay [0, seq) if seq > 0, then apply
SGLang also publishes AllBlocksCleared as seq 0 of a new engine: applying it after our own
clear is a no-op, so a reset is safe whether or not that batch is seen.

`feed` never blocks: a message in order is applied at once; one that needs a replay starts a
resync task and is held, with every message after it, until the replay is applied; then the
held messages are fed in order. Live messages that arrive during a replay and repeat what it
applied are skipped while they increase; one that does not increase is a restart.

`start` (once the transports are listening) replays the engine's whole buffer right away
(joining a running engine that may stay idle), with live messages held meanwhile. Without a
replay endpoint, or when the replay fails or lacks batches (the engine's buffer is bounded),
the stream logs, counts and goes on: the view of that worker is then partial until its blocks
churn.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TypeAlias

import zmq
import zmq.asyncio

from switchyard.router.kv.decode import (
    END_SEQ,
    DecodedBatch,
    decode_payload_packed,
    is_end_marker,
    split_frames,
)
from switchyard.router.kv.errors import KvDecodeError
from switchyard.router.kv.types import KvCounters, KvSink, WorkerKey

log = logging.getLogger(__name__)


class ReplayError(Exception):
    """The replay socket did not answer in time, or answered garbage."""


async def fetch_replay(
    context: zmq.asyncio.Context, endpoint: str, start: int, stop: int, timeout: float
) -> list[tuple[int, bytes]]:
    """Replayed (seq, payload) with start <= seq < stop, in the order received: a fresh DEALER
    sends `[b"", start]` and reads until the end marker or seq stop - 1 (the rest is on the
    live socket already)."""
    timeout_ms = int(timeout * 1000)
    dealer = context.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(endpoint)
        await dealer.send_multipart([b"", start.to_bytes(8, "big")])
        batches: list[tuple[int, bytes]] = []
        while True:
            if not await dealer.poll(timeout_ms):  # POLLIN
                raise ReplayError(f"{endpoint} silent for {timeout} s")
            try:
                seq, payload = split_frames(await dealer.recv_multipart())
            except KvDecodeError as exc:
                raise ReplayError(str(exc)) from exc
            if is_end_marker(seq, payload) or seq == END_SEQ:
                return batches
            if seq < stop:
                batches.append((seq, payload))
            if seq >= stop - 1:
                return batches
    except zmq.ZMQError as exc:
        raise ReplayError(str(exc)) from exc
    finally:
        dealer.close(linger=0)


Message: TypeAlias = bytes | DecodedBatch


class KvStream:
    def __init__(
        self,
        worker: WorkerKey,
        sink: KvSink,
        counters: KvCounters,
        context: zmq.asyncio.Context,
        *,
        replay_endpoint: str | None = None,
        replay_timeout: float = 2.0,
        yield_every: int = 64,
        name: str = "",
    ) -> None:
        self.worker = worker
        self.replay_endpoint = replay_endpoint
        self.name = name or f"{worker[0]}/{worker[1]}"
        self._sink = sink
        self._counters = counters
        self._context = context
        self._replay_timeout = replay_timeout
        self._yield_every = max(1, yield_every)
        self._last: int | None = None
        self._held: collections.deque[tuple[int, Message]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._started = False
        self.messages = 0  # live messages received
        self.replayed = 0  # batches applied from replays
        self.caught_up = asyncio.Event()  # the catch-up replay at start is over
        self.on_contact: Callable[[], None] | None = None  # first message or replayed batch

    @property
    def last_seq(self) -> int | None:
        """Sequence of the last batch applied (None before the first)."""
        return self._last

    @property
    def heard(self) -> bool:
        """Whether anything came from the engine (a live message or a replayed batch)."""
        return self.messages > 0 or self.replayed > 0

    def start(self) -> None:
        """Replay the engine's buffer (once; later calls do nothing). The owner clears the
        worker before the first transport feeds the stream."""
        if self._started:
            return
        self._started = True
        if self.replay_endpoint is None or self._task is not None:
            self.caught_up.set()
            return
        self._task = asyncio.get_running_loop().create_task(
            self._catch_up(), name=f"kv-catch-up:{self.name}"
        )

    def stop(self) -> None:
        """Take no message from now on (a transport's read callback may still run in the
        loop iteration that stops its task); `close` then ends a replay under way."""
        self._closed = True

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def feed(self, seq: int, message: Message) -> None:
        """One live message (the payload, or a batch already decoded)."""
        if self._closed:
            return
        self.messages += 1
        if self.messages == 1 and self.on_contact is not None:
            self.on_contact()
        if self._task is not None:
            self._held.append((seq, message))
            return
        self._feed_now(seq, message)

    def _feed_now(self, seq: int, message: Message) -> None:
        last = self._last
        if last is None:
            if seq > 0:
                self._counters.late_joins += 1
                self._resync(0, seq, seq, message)
                return
        elif seq == last + 1:
            pass
        elif seq > last + 1:
            self._counters.gaps += 1
            log.info("kv events gap worker=%s last=%d seq=%d", self.name, last, seq)
            self._resync(last + 1, seq, seq, message)
            return
        else:
            self._counters.resets += 1
            log.info(
                "kv events reset worker=%s last=%d seq=%d: clearing worker", self.name, last, seq
            )
            self._sink.clear_worker(self.worker)
            self._last = None
            if seq > 0:
                self._resync(0, seq, seq, message)
                return
        self._apply(seq, message)

    def _resync(self, start: int, stop: int, seq: int, message: Message) -> None:
        self._held.appendleft((seq, message))
        if self.replay_endpoint is None:
            self._counters.replay_failures += 1
            log.warning(
                "kv events worker=%s: batches %d..%d missed and no replay endpoint",
                self.name,
                start,
                stop - 1,
            )
            self._last = stop - 1  # go on from the message that showed the gap
            self._drain()
            return
        self._task = asyncio.get_running_loop().create_task(
            self._replay(start, stop), name=f"kv-replay:{self.name}"
        )

    async def _catch_up(self) -> None:
        try:
            await self._replay(0, END_SEQ, catch_up=True)
        finally:
            self.caught_up.set()

    async def _replay(self, start: int, stop: int, catch_up: bool = False) -> None:
        counters = self._counters
        applied = 0
        try:
            assert self.replay_endpoint is not None
            if not catch_up:
                counters.replays += 1
            try:
                batches = await fetch_replay(
                    self._context, self.replay_endpoint, start, stop, self._replay_timeout
                )
            except ReplayError as exc:
                if catch_up:
                    log.info("kv catch-up replay worker=%s: %s", self.name, exc)
                else:
                    counters.replay_failures += 1
                    log.warning("kv replay failed worker=%s: %s", self.name, exc)
                batches = []
            if batches:
                if catch_up:
                    counters.replays += 1  # counted when it had something to replay
                if self.replayed == 0 and self.messages == 0 and self.on_contact:
                    self.on_contact()
            for seq, payload in batches:
                if self._last is not None and seq <= self._last:
                    continue  # a duplicate: already applied
                if catch_up and self._last is not None and seq != self._last + 1:
                    break  # keep the applied run contiguous; a later gap replays the rest
                self._apply(seq, payload)
                applied += 1
                if applied % self._yield_every == 0:
                    await asyncio.sleep(0)  # a long replay must not starve routing
            counters.replayed_batches += applied
            self.replayed += applied
            if catch_up:
                if applied:
                    log.info(
                        "kv catch-up worker=%s replayed %d batches through seq %s",
                        self.name,
                        applied,
                        self._last,
                    )
            elif applied != stop - start:
                counters.replay_incomplete += 1
                log.info(
                    "kv replay worker=%s: got %d of batches %d..%d (engine buffer too short?)",
                    self.name,
                    applied,
                    start,
                    stop - 1,
                )
            if not catch_up and (self._last is None or self._last < stop - 1):
                self._last = stop - 1  # go on from the message that showed the gap
        finally:
            self._task = None
        if not self._closed:
            self._drain(skip_repeats=True)

    def _drain(self, skip_repeats: bool = False) -> None:
        """Feed the held messages in order (until one needs another replay)."""
        held = self._held
        previous: int | None = None
        while held and self._task is None:
            seq, message = held.popleft()
            increasing = previous is None or seq > previous
            previous = seq
            last = self._last
            if skip_repeats and increasing and last is not None and seq <= last:
                continue  # already applied by the replay
            skip_repeats = False
            self._feed_now(seq, message)

    def _apply(self, seq: int, message: Message) -> None:
        self._last = seq
        if type(message) is bytes:
            try:
                batch = decode_payload_packed(message)
            except KvDecodeError as exc:
                self._counters.decode_errors += 1
                log.warning("kv events worker=%s seq=%d: %s", self.name, seq, exc)
                return
        else:
            batch = message  # type: ignore[assignment]
        if batch.skipped:
            self._counters.unknown_events += batch.skipped
        self._sink.apply_batch(self.worker, batch.records)
