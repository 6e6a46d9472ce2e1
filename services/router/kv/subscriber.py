"""One engine's KV events over ZMQ: a SUB on its PUB socket, resynced from its replay socket.

Sequence rules (per publisher; `last` is the last sequence applied):
    first message, seq 0          apply
    first message, seq > 0        late join: replay [0, seq), then apply
    seq == last + 1               apply
    seq > last + 1                gap: replay [last + 1, seq), then apply
    seq <= last                   reset (the engine restarted, its cache is empty): clear the
                                  worker, replay [0, seq) if seq > 0, then apply
SGLang also publishes AllBlocksCleared as seq 0 of a new engine: applying it after our own
clear is a no-op, so a reset is safe whether or not that batch is seen.

Replay: a fresh DEALER sends `[b"", start (8-byte BE)]` and reads replies until the end
marker, or until it has every batch before `seq` (later ones come on the SUB anyway), with an
idle timeout. Replayed batches are applied in order. Without a replay endpoint, or when the
replay fails or lacks batches (the engine's buffer is bounded), the source logs, counts and
goes on from `seq`: the view of that worker is then partial until its blocks churn.

A source starts from an empty view of its worker (it clears the worker first).
"""

from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio

from switchyard.router.kv.decode import (
    END_SEQ,
    decode_payload,
    is_end_marker,
    split_frames,
)
from switchyard.router.kv.errors import KvDecodeError
from switchyard.router.kv.types import KvCounters, KvSink

log = logging.getLogger(__name__)

_WILDCARD_HOSTS = ("*", "0.0.0.0", "[::]", "::", "")


def resolve_endpoint(endpoint: str, host: str | None) -> str:
    """An endpoint an engine advertises for binding (`tcp://*:5557`, `tcp://0.0.0.0:5557`) as
    one we can connect to: the wildcard replaced by the engine's `host`."""
    scheme, sep, rest = endpoint.partition("://")
    if scheme != "tcp" or not sep or not host:
        return endpoint
    address, colon, port = rest.rpartition(":")
    if not colon or address not in _WILDCARD_HOSTS:
        return endpoint
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


class ReplayError(Exception):
    """The replay socket did not answer in time, or answered garbage."""


class ZmqKvSource:
    def __init__(
        self,
        instance_id: int,
        sink: KvSink,
        counters: KvCounters,
        context: zmq.asyncio.Context,
        *,
        endpoint: str,
        replay_endpoint: str | None = None,
        replay_timeout: float = 2.0,
        yield_every: int = 64,
    ) -> None:
        """`endpoint`/`replay_endpoint` must be connectable (see resolve_endpoint)."""
        self.instance_id = instance_id
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._sink = sink
        self._counters = counters
        self._context = context
        self._replay_timeout = replay_timeout
        self._yield_every = max(1, yield_every)
        self._last: int | None = None
        # After the catch-up replay at start: live batches up to this sequence were already
        # applied from the replay and are skipped (they are not a reset).
        self._replayed_through: int | None = None
        self._live_last: int | None = None
        self.caught_up = asyncio.Event()  # set once the catch-up replay at start is over

    @property
    def last_seq(self) -> int | None:
        """Sequence of the last batch applied (None before the first)."""
        return self._last

    async def run(self) -> None:
        """Follow the publisher until cancelled."""
        self._sink.clear_worker(self.instance_id)
        sub = self._context.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, 0)  # never drop: a drop is a gap and costs a replay
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            sub.connect(self.endpoint)
            # Replay only once the subscription is on its way: a batch published between
            # the replay's snapshot and a late subscription would be lost, and an engine
            # that then stays idle would never reveal the gap.
            # poll, not asyncio.wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that races its inner future, and the source would then never stop.
            try:
                if not await monitor.poll(int(self._replay_timeout * 1000)):
                    raise TimeoutError
            except TimeoutError:
                log.info(
                    "kv events instance_id=%d: %s not reachable yet",
                    self.instance_id,
                    self.endpoint,
                )
            finally:
                sub.disable_monitor()
                monitor.close(linger=0)
            log.info(
                "kv events subscribed instance_id=%d endpoint=%s replay=%s",
                self.instance_id,
                self.endpoint,
                self.replay_endpoint,
            )
            await self._catch_up()
            while True:
                await self.on_message(await sub.recv_multipart())
        finally:
            sub.close(linger=0)

    async def on_message(self, frames: list[bytes]) -> None:
        """Handle one PUB message (public for tests and for other transports)."""
        try:
            seq, payload = split_frames(frames)
        except KvDecodeError as exc:
            self._counters.decode_errors += 1
            log.warning("kv events instance_id=%d: %s", self.instance_id, exc)
            return
        through = self._replayed_through
        if through is not None:
            # Live batches the catch-up replay already applied arrive in increasing order; one
            # that does not increase means the engine restarted meanwhile (handled below).
            increasing = self._live_last is None or seq > self._live_last
            self._live_last = seq
            if increasing and seq < through:
                return
            self._replayed_through = None
            if increasing and seq == through:
                return
        last = self._last
        if last is None:
            if seq > 0:
                self._counters.late_joins += 1
                await self._resync(0, seq)
        elif seq == last + 1:
            pass
        elif seq > last + 1:
            self._counters.gaps += 1
            log.info("kv events gap instance_id=%d last=%d seq=%d", self.instance_id, last, seq)
            await self._resync(last + 1, seq)
        else:
            self._counters.resets += 1
            log.info(
                "kv events reset instance_id=%d last=%d seq=%d: clearing worker",
                self.instance_id,
                last,
                seq,
            )
            self._sink.clear_worker(self.instance_id)
            if seq > 0:
                await self._resync(0, seq)
        self._apply(seq, payload)

    async def _catch_up(self) -> None:
        try:
            await self._replay_buffer()
        finally:
            self.caught_up.set()

    async def _replay_buffer(self) -> None:
        """Joining a running engine: replay everything its buffer holds right away, so the
        index is complete even if the engine stays idle (it publishes nothing until its next
        request). The SUB is already connected, so nothing published after the replay's
        snapshot is lost; a batch lost in between shows up as a gap and is replayed then."""
        if self.replay_endpoint is None:
            return
        try:
            batches = await self._fetch(self.replay_endpoint, 0, END_SEQ)
        except ReplayError as exc:
            log.info("kv catch-up replay instance_id=%d: %s", self.instance_id, exc)
            return
        if not batches:
            return
        self._counters.replays += 1
        for count, (seq, payload) in enumerate(batches, start=1):
            if self._last is not None and seq != self._last + 1:
                continue  # keep the applied run contiguous; a later gap replays the rest
            self._apply(seq, payload)
            if count % self._yield_every == 0:
                await asyncio.sleep(0)
        self._counters.replayed_batches += len(batches)
        self._replayed_through = self._last
        log.info(
            "kv catch-up instance_id=%d replayed %d batches through seq %s",
            self.instance_id,
            len(batches),
            self._last,
        )

    def _apply(self, seq: int, payload: bytes) -> None:
        self._last = seq
        try:
            batch = decode_payload(payload)
        except KvDecodeError as exc:
            self._counters.decode_errors += 1
            log.warning("kv events instance_id=%d seq=%d: %s", self.instance_id, seq, exc)
            return
        if batch.skipped:
            self._counters.unknown_events += batch.skipped
        self._sink.apply_batch(self.instance_id, batch.records)

    async def _resync(self, start: int, stop: int) -> None:
        """Apply the batches [start, stop) from the replay socket, as far as it has them."""
        counters = self._counters
        if self.replay_endpoint is None:
            counters.replay_failures += 1
            log.warning(
                "kv events instance_id=%d: batches %d..%d missed and no replay endpoint",
                self.instance_id,
                start,
                stop - 1,
            )
            return
        counters.replays += 1
        try:
            batches = await self._fetch(self.replay_endpoint, start, stop)
        except ReplayError as exc:
            counters.replay_failures += 1
            log.warning("kv replay failed instance_id=%d: %s", self.instance_id, exc)
            return
        expected = start
        applied = 0
        for seq, payload in batches:
            if seq < expected:
                continue  # a duplicate: already applied
            self._apply(seq, payload)
            expected = seq + 1
            applied += 1
            if applied % self._yield_every == 0:
                await asyncio.sleep(0)  # a long replay must not starve routing
        counters.replayed_batches += applied
        if applied != stop - start:
            counters.replay_incomplete += 1
            log.info(
                "kv replay instance_id=%d: got %d of batches %d..%d (engine buffer too short?)",
                self.instance_id,
                applied,
                start,
                stop - 1,
            )

    async def _fetch(self, endpoint: str, start: int, stop: int) -> list[tuple[int, bytes]]:
        """Replayed (seq, payload) with start <= seq < stop, in the order received."""
        timeout_ms = int(self._replay_timeout * 1000)
        dealer = self._context.socket(zmq.DEALER)
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(endpoint)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            batches: list[tuple[int, bytes]] = []
            while True:
                if not await dealer.poll(timeout_ms):  # POLLIN
                    raise ReplayError(f"{endpoint} silent for {self._replay_timeout} s")
                try:
                    seq, payload = split_frames(await dealer.recv_multipart())
                except KvDecodeError as exc:
                    raise ReplayError(str(exc)) from exc
                if is_end_marker(seq, payload) or seq == END_SEQ:
                    return batches
                if seq < stop:
                    batches.append((seq, payload))
                if seq >= stop - 1:
                    return batches  # the rest is on the SUB socket already
        except zmq.ZMQError as exc:
            raise ReplayError(str(exc)) from exc
        finally:
            dealer.close(linger=0)
