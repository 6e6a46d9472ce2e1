"""The prefill side's KV waiting for pickup, and the handover counters (no I/O here).

A prefill engine `offer`s a prompt's KV under a key (SGLang: its bootstrap room; vLLM: its
request id) with a deadline; the blocks stay pinned meanwhile (`release` unpins them). A
decode engine's fetch (`kv_transfer`) `claim`s the key, waiting for it to be offered when
asked to (SGLang's decode may ask before the prefill is done), receives the payload and
acknowledges it: `confirm` releases the blocks, resolves the offer's `picked` future with True
and counts the handover; a fetch that fails after its claim `unclaim`s, putting the KV back.
At the deadline an unclaimed offer is dropped (`picked` resolves False, counted as expired);
a claimed one is dropped if its claim fails. A key dropped at its deadline is remembered (the
most recent few thousand), so a late fetch is told "expired" rather than "unknown".
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable

from switchyard.mock_engine.errors import HandoverMissing, TransferKey

logger = logging.getLogger(__name__)

__all__ = [
    "HandoverBoard",
    "HandoverMissing",
    "KvPayload",
    "TransferCounters",
    "TransferKey",
    "describe",
    "request_key",
    "room_key",
]

_REMEMBER_EXPIRED = 4096


def room_key(room: int) -> TransferKey:
    return ("room", room)


def request_key(request_id: str) -> TransferKey:
    return ("request", request_id)


def describe(key: TransferKey) -> str:
    """`room=12` / `request=abc`, as log lines and error messages name a transfer."""
    return f"{key[0]}={key[1]}"


@dataclasses.dataclass(frozen=True, slots=True)
class KvPayload:
    """What a prefill engine hands over: the prompt it computed and its first token."""

    token_ids: tuple[int, ...]
    first_token: int | None
    block_ids: tuple[int, ...] = ()  # vLLM's remote_block_ids (SGLang: empty)
    engine_id: str = ""


@dataclasses.dataclass(slots=True)
class TransferCounters:
    """What an engine did, for tests and GetServerInfo (SGLang's scheduler_info)."""

    handed_over: int = 0  # prefill side: KV taken over by a decode engine
    expired: int = 0  # prefill side: KV dropped at its deadline, nobody took it
    received: int = 0  # decode side: KV taken over from a prefill engine
    failed: int = 0  # decode side: a transfer that failed (the request failed with it)

    def as_dict(self) -> dict[str, int]:
        return {
            "kv_handed_over": self.handed_over,
            "kv_transfers_expired": self.expired,
            "kv_received": self.received,
            "kv_transfer_failures": self.failed,
        }


class _Offer:
    __slots__ = ("key", "payload", "release", "picked", "timer", "claimed", "overdue")

    def __init__(
        self,
        key: TransferKey,
        payload: KvPayload,
        release: Callable[[], None],
        picked: asyncio.Future[bool],
    ) -> None:
        self.key = key
        self.payload = payload
        self.release = release
        self.picked = picked
        self.timer: asyncio.TimerHandle | None = None
        self.claimed = False
        self.overdue = False  # the deadline passed while claimed: drop it if the claim fails


class HandoverBoard:
    """Offers by key; one claim at a time each. Runs on the event loop (no locks)."""

    def __init__(self, counters: TransferCounters | None = None) -> None:
        self.counters = counters if counters is not None else TransferCounters()
        self._offers: dict[TransferKey, _Offer] = {}
        self._expired: collections.OrderedDict[TransferKey, None] = collections.OrderedDict()
        self._changed = asyncio.Event()  # set (and replaced) whenever an offer appears
        self._closed = False

    def __len__(self) -> int:
        return len(self._offers)

    def __contains__(self, key: TransferKey) -> bool:
        return key in self._offers

    def offer(
        self,
        key: TransferKey,
        payload: KvPayload,
        *,
        release: Callable[[], None],
        deadline_s: float,
    ) -> asyncio.Future[bool]:
        """Keep `payload` for pickup for `deadline_s`; the future says whether it was taken.
        ValueError when the key is already on offer (the caller still owns `release`)."""
        if key in self._offers:
            raise ValueError(f"KV for {describe(key)} is already waiting for pickup")
        loop = asyncio.get_running_loop()
        offer = _Offer(key, payload, release, loop.create_future())
        if self._closed:
            self._drop(offer, expired=False)
            return offer.picked
        offer.timer = loop.call_later(deadline_s, self._deadline, key)
        self._offers[key] = offer
        self._expired.pop(key, None)
        self._wake()
        return offer.picked

    def withdraw(self, key: TransferKey) -> None:
        """Drop an unclaimed offer now (its requester went away); a claimed one goes if its
        claim fails."""
        offer = self._offers.get(key)
        if offer is None:
            return
        if offer.claimed:
            offer.overdue = True
        else:
            self._remove(offer)
            self._drop(offer, expired=False)

    async def claim(self, key: TransferKey, wait_s: float = 0.0) -> KvPayload:
        """Take the offer under `key`, waiting up to `wait_s` for it to appear (or to be put
        back); HandoverMissing when there is none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait_s)
        while True:
            offer = self._offers.get(key)
            if offer is not None and not offer.claimed:
                offer.claimed = True
                return offer.payload
            if key in self._expired and offer is None:
                raise HandoverMissing(key, "expired", f"KV for {describe(key)} has expired")
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closed:
                if offer is None and wait_s <= 0:
                    raise HandoverMissing(
                        key, "unknown", f"no KV for {describe(key)} (unknown, or taken already)"
                    )
                raise HandoverMissing(
                    key, "timeout", f"no KV for {describe(key)} within {wait_s:g}s"
                )
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                pass

    def confirm(self, key: TransferKey, peer: str) -> None:
        """The claimed KV reached its decode engine: release it and count the handover."""
        offer = self._offers.pop(key, None)
        if offer is None:  # pragma: no cover - a claimed offer stays until confirmed
            return
        if offer.timer is not None:
            offer.timer.cancel()
        self.counters.handed_over += 1
        logger.info(
            "kv handed over %s to=%s tokens=%d blocks=%d",
            describe(key),
            peer,
            len(offer.payload.token_ids),
            len(offer.payload.block_ids),
        )
        offer.release()
        if not offer.picked.done():
            offer.picked.set_result(True)

    def unclaim(self, key: TransferKey) -> None:
        """The claimed KV did not reach its decode engine: offer it again (or drop it if its
        deadline passed meanwhile)."""
        offer = self._offers.get(key)
        if offer is None:  # pragma: no cover
            return
        offer.claimed = False
        if offer.overdue:
            self._remove(offer)
            self._drop(offer, expired=True)
        else:
            self._wake()

    def close(self) -> None:
        """Drop every offer (the engine is stopping)."""
        self._closed = True
        for offer in list(self._offers.values()):
            self._remove(offer)
            self._drop(offer, expired=False)
        self._wake()

    def _deadline(self, key: TransferKey) -> None:
        offer = self._offers.get(key)
        if offer is None:
            return
        offer.timer = None
        if offer.claimed:
            offer.overdue = True
            return
        self._remove(offer)
        self._drop(offer, expired=True)

    def _remove(self, offer: _Offer) -> None:
        del self._offers[offer.key]
        if offer.timer is not None:
            offer.timer.cancel()
            offer.timer = None

    def _drop(self, offer: _Offer, *, expired: bool) -> None:
        if expired:
            self.counters.expired += 1
            self._expired[offer.key] = None
            while len(self._expired) > _REMEMBER_EXPIRED:
                self._expired.popitem(last=False)
            logger.info("kv transfer expired %s: no decode engine took it", describe(offer.key))
        offer.release()
        if not offer.picked.done():
            offer.picked.set_result(False)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
