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

Catch-up: `start` (once a transport listens) replays the engine's whole buffer (joining a
running engine that may stay idle), and `reconnected` (every time a transport's connection to
the publisher is made again) replays from the last applied sequence: a publisher that binds
late, or restarts, and then publishes one burst before the subscription reaches it loses that
burst on the PUB socket, and nothing live would ever reveal it. The replay from the last
applied sequence `L` also tells a restart apart: the same publisher still holds batch `L`
(its buffer keeps the newest batches) with the very payload applied; a restarted one holds
nothing at `L`, or another payload there. A restart clears the worker and replays from 0.
Live messages are held meanwhile. The connection is made before the subscription reaches the
publisher, so a batch published after the replay's snapshot can still be dropped by the PUB;
the stream checks again `FOLLOW_UPS` seconds after each (re)connect (a replay from the last
applied sequence: one batch when nothing is new). Without a replay endpoint, or when the
replay fails or lacks batches (the engine's buffer is bounded), the stream logs, counts and
goes on: the view of that worker is then partial until its blocks churn.

Admission: blocks stored in batches stamped before `not_before` (the engine's wall clock;
fleet's admission time of the engine) are not indexed: an engine that warms up, then resets
its prefix cache, may publish that AllBlocksCleared only at its next step (vLLM), so its
warm-up blocks would otherwise be claimed until its first request.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
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
from switchyard.router.kv.types import STORED, KvCounters, KvSink, Record, WorkerKey, WorkerKvStats

log = logging.getLogger(__name__)

# Seconds after a (re)connect at which the catch-up is repeated: batches published between
# the first catch-up's snapshot and the subscription reaching the publisher were dropped.
FOLLOW_UPS = (1.0, 4.0)


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
        not_before: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        follow_ups: tuple[float, ...] = FOLLOW_UPS,
    ) -> None:
        self.worker = worker
        self.replay_endpoint = replay_endpoint
        self.name = name or f"{worker[0]}/{worker[1]}"
        self.not_before = not_before  # engine wall clock: stores stamped earlier are dropped
        self._sink = sink
        self._counters = counters
        self._context = context
        self._replay_timeout = replay_timeout
        self._yield_every = max(1, yield_every)
        self._clock = clock
        self._wall_clock = wall_clock
        self._last: int | None = None
        self._last_payload: bytes | None = None  # of batch `_last`: tells a restart apart
        self._held: collections.deque[tuple[int, Message]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._started = False
        self._catch_up_wanted = False  # a (re)connect came while a replay was under way
        self._follow_up_delays = follow_ups
        self._follow_ups: list[asyncio.TimerHandle] = []
        self.stats = WorkerKvStats()
        self.messages = 0  # live messages received
        self.replayed = 0  # batches applied from replays
        self.caught_up = asyncio.Event()  # the first catch-up replay is over
        self.on_contact: Callable[[], None] | None = None  # first message or replayed batch

    @property
    def last_seq(self) -> int | None:
        """Sequence of the last batch applied (None before the first)."""
        return self._last

    @property
    def heard(self) -> bool:
        """Whether anything came from the engine (a live message or a replayed batch)."""
        return self.messages > 0 or self.replayed > 0

    @property
    def replaying(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        """Replay the engine's buffer (once; later calls do nothing). The owner clears the
        worker before the first transport feeds the stream."""
        if self._started:
            return
        self._started = True
        self._catch_up_now()

    def reconnected(self) -> None:
        """A transport's connection to the publisher was made (again): catch up from the last
        applied sequence (the whole buffer before the first batch)."""
        stats = self.stats
        stats.connected = True
        stats.reconnects += 1
        self._counters.reconnects += 1
        if not self._started:
            self.start()
        else:
            self._catch_up_now()
        if self.replay_endpoint is not None and not self._closed:
            self._cancel_follow_ups()
            loop = asyncio.get_running_loop()
            self._follow_ups = [
                loop.call_later(d, self._catch_up_now) for d in self._follow_up_delays
            ]

    def _cancel_follow_ups(self) -> None:
        for handle in self._follow_ups:
            handle.cancel()
        self._follow_ups = []

    def disconnected(self) -> None:
        self.stats.connected = False

    def stop(self) -> None:
        """Take no message from now on (a transport's read callback may still run in the
        loop iteration that stops its task); `close` then ends a replay under way."""
        self._closed = True
        self._cancel_follow_ups()

    async def close(self) -> None:
        self._closed = True
        self._cancel_follow_ups()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def feed(self, seq: int, message: Message) -> None:
        """One live message (the payload, or a batch already decoded)."""
        if self._closed:
            return
        self.messages += 1
        now = self._clock()
        self.stats.heard_at = now
        if self.messages == 1 and self.on_contact is not None:
            self.on_contact()
        if self._task is not None:
            if not self._held:
                self.stats.held_since = now
            self._held.append((seq, message))
            return
        self._feed_now(seq, message)

    # ---- sequence rules -----------------------------------------------------------------

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
            self.stats.gaps += 1
            log.info("kv events gap worker=%s last=%d seq=%d", self.name, last, seq)
            self._resync(last + 1, seq, seq, message)
            return
        else:
            log.info(
                "kv events reset worker=%s last=%d seq=%d: clearing worker", self.name, last, seq
            )
            self._reset()
            if seq > 0:
                self._resync(0, seq, seq, message)
                return
        self._apply(seq, message)

    def _reset(self) -> None:
        """The publisher restarted: its cache is empty, its sequence starts again."""
        self._counters.resets += 1
        self.stats.resets += 1
        self._sink.clear_worker(self.worker)
        self._last = None
        self._last_payload = None

    def _resync(self, start: int, stop: int, seq: int, message: Message) -> None:
        if not self._held:
            self.stats.held_since = self._clock()
        self._held.appendleft((seq, message))
        if self.replay_endpoint is None:
            self._counters.replay_failures += 1
            self.stats.replay_failures += 1
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

    # ---- replays ------------------------------------------------------------------------

    def _catch_up_now(self) -> None:
        if self._closed:
            return
        if self.replay_endpoint is None:
            self.caught_up.set()
            return
        if self._task is not None:
            self._catch_up_wanted = True  # after the replay under way
            return
        self._task = asyncio.get_running_loop().create_task(
            self._catch_up(), name=f"kv-catch-up:{self.name}"
        )

    async def _fetch(self, start: int, stop: int, quiet: bool) -> list[tuple[int, bytes]] | None:
        """The replayed batches, or None when the replay failed (logged and counted)."""
        assert self.replay_endpoint is not None
        self.stats.replays += 1
        try:
            return await fetch_replay(
                self._context, self.replay_endpoint, start, stop, self._replay_timeout
            )
        except ReplayError as exc:
            self.stats.replay_failures += 1
            if quiet:
                log.info("kv catch-up replay worker=%s: %s", self.name, exc)
            else:
                self._counters.replay_failures += 1
                log.warning("kv replay failed worker=%s: %s", self.name, exc)
            return None

    async def _catch_up(self) -> None:
        try:
            while True:
                self._catch_up_wanted = False
                await self._resume()
                if not self._catch_up_wanted or self._closed:
                    break
        finally:
            self.caught_up.set()
            self._finished()

    async def _resume(self) -> None:
        """Replay from the last applied sequence (from 0 before the first), rebuilding the
        worker when the publisher turns out to have restarted."""
        last = self._last
        batches = await self._fetch(0 if last is None else last, END_SEQ, quiet=True)
        if batches is None:
            return
        if last is not None:
            first = batches[0][0] if batches else None
            if first is None or (
                first == last
                and self._last_payload is not None
                and batches[0][1] != self._last_payload
            ):
                log.info(
                    "kv catch-up worker=%s: the publisher restarted (seq %d %s): rebuilding",
                    self.name,
                    last,
                    "gone" if first is None else "holds another batch",
                )
                self._counters.publisher_restarts += 1
                self._reset()
                again = await self._fetch(0, END_SEQ, quiet=True)
                if again is None:
                    return
                batches = again
            elif first > last + 1:
                self._counters.replay_incomplete += 1
                self.stats.gaps += 1
                log.info(
                    "kv catch-up worker=%s: batches %d..%d gone from the engine's buffer",
                    self.name,
                    last + 1,
                    first - 1,
                )
                self._last = first - 1
        applied = await self._apply_replayed(batches, contiguous=True)
        if applied:
            self._counters.replays += 1  # counted when it had something to replay
            log.info(
                "kv catch-up worker=%s replayed %d batches through seq %s",
                self.name,
                applied,
                self._last,
            )

    async def _replay(self, start: int, stop: int) -> None:
        """Fill a gap (or a late join, or a restart's first batches): [start, stop)."""
        try:
            self._counters.replays += 1
            batches = await self._fetch(start, stop, quiet=False)
            applied = await self._apply_replayed(batches or [], contiguous=False)
            if batches is not None and applied != stop - start:
                self._counters.replay_incomplete += 1
                log.info(
                    "kv replay worker=%s: got %d of batches %d..%d (engine buffer too short?)",
                    self.name,
                    applied,
                    start,
                    stop - 1,
                )
            if self._last is None or self._last < stop - 1:
                self._last = stop - 1  # go on from the message that showed the gap
                self._last_payload = None
        finally:
            self._finished()

    async def _apply_replayed(self, batches: list[tuple[int, bytes]], contiguous: bool) -> int:
        applied = 0
        for seq, payload in batches:
            if self._closed:
                break
            last = self._last
            if last is not None and seq <= last:
                continue  # a duplicate: already applied
            if contiguous and last is not None and seq != last + 1:
                break  # keep the applied run contiguous; a later gap replays the rest
            if self.replayed == 0 and self.messages == 0 and self.on_contact:
                self.on_contact()
            self.stats.heard_at = self._clock()
            self._apply(seq, payload)
            applied += 1
            self.replayed += 1
            if applied % self._yield_every == 0:
                await asyncio.sleep(0)  # a long replay must not starve routing
        self._counters.replayed_batches += applied
        return applied

    def _finished(self) -> None:
        """A replay task ended: a (re)connect that came meanwhile catches up now; else the
        held messages are fed."""
        self._task = None
        if self._closed:
            return
        if self._catch_up_wanted:
            self._catch_up_wanted = False
            self._task = asyncio.get_running_loop().create_task(
                self._catch_up(), name=f"kv-catch-up:{self.name}"
            )
            return
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
        if not held:
            self.stats.held_since = None

    # ---- applying -----------------------------------------------------------------------

    def _apply(self, seq: int, message: Message) -> None:
        self._last = seq
        stats = self.stats
        stats.last_seq = seq
        stats.batches += 1
        if type(message) is bytes:
            self._last_payload = message
            try:
                batch = decode_payload_packed(message)
            except KvDecodeError as exc:
                self._counters.decode_errors += 1
                log.warning("kv events worker=%s seq=%d: %s", self.name, seq, exc)
                return
        else:
            self._last_payload = None
            batch = message  # type: ignore[assignment]
        if batch.skipped:
            self._counters.unknown_events += batch.skipped
        records = batch.records
        ts = batch.timestamp
        if type(ts) is float or type(ts) is int:
            stats.batch_ts = ts
            stats.lag_s = max(0.0, self._wall_clock() - ts)
            if self.not_before is not None and ts < self.not_before:
                records = self._before_admission(records)
        self._sink.apply_batch(self.worker, records)

    def _before_admission(self, records: list[Record]) -> list[Record]:
        """A batch the engine published before it was admitted: its removals and clears
        apply, its stores are not claimed (warm-up blocks, or blocks of a previous life)."""
        kept = [r for r in records if r.KIND != STORED]
        self._counters.pre_admission_stores += len(records) - len(kept)
        return kept
