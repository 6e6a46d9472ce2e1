"""List + watch of the pods one label selector picks: the informer pattern of client-go.

    list (paged, consistent)  ->  pods by uid, resourceVersion R
    watch from R              ->  ADDED / MODIFIED / DELETED update the pods; every event,
                                  BOOKMARK included, moves R forward
    stream ends (the server's timeout)      -> watch again from R
    410 Gone (R too old, or a continue token expired) -> list again
    any other failure (API down, 5xx, 403, broken stream) -> back off, then watch from R again
                                  (list again if no list succeeded yet)

While the API server is unreachable the last known pods stay in force (fleet's probes still
take a dead engine out), as an informer's cache does. `on_change` is called after every change
of the pod set; the caller reads `pods` then.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from switchyard.fleet.k8s.errors import KubeApiError, ResourceGone
from switchyard.fleet.k8s.types import PodLister

log = logging.getLogger(__name__)


class Backoff:
    """Exponential with full jitter, as client-go's: the n-th consecutive failure waits a
    random time up to min(cap, base x 2^n)."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None):
        if not 0 < base <= cap:
            raise ValueError(f"backoff needs 0 < base <= cap, got {base}, {cap}")
        self.base, self.cap = base, cap
        self._rng = rng or random.Random()
        self.failures = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * 2**self.failures)
        self.failures += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


class PodWatch:
    def __init__(
        self,
        api: PodLister,
        selector: str,
        on_change: Callable[[], None],
        *,
        backoff: Backoff | None = None,
        watch_timeout_s: int = 300,
        page_size: int = 500,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self.selector = selector
        self._on_change = on_change
        self._backoff = backoff or Backoff()
        self._watch_timeout_s = watch_timeout_s
        self._page_size = page_size
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> the pod as last seen
        self.resource_version: str | None = None  # None: list before watching
        self.synced = False  # a list succeeded at least once
        self.lists = 0  # completed lists (the first one, and every re-list)
        self._problem = ""

    async def run(self) -> None:
        """Forever (until cancelled)."""
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                progressed = await self._watch()
                if progressed:
                    self._backoff.reset()
                    continue
                # A stream that ended at once with nothing in it: do not spin on such a server.
                await self._sleep(self._backoff.next_delay())
            except ResourceGone as exc:
                log.info(
                    "pod watch %r: %s; listing again", self.selector, exc.message or "410 Gone"
                )
                self.resource_version = None
                if self._backoff.failures:  # repeated 410s: not in a tight loop either
                    await self._sleep(self._backoff.next_delay())
                else:
                    self._backoff.failures += 1
            except KubeApiError as exc:
                self._report(exc)
                await self._sleep(self._backoff.next_delay())

    async def _list(self) -> None:
        pods: dict[str, dict[str, Any]] = {}
        token: str | None = None
        version = ""
        while True:
            page = await self._api.list_pods(self.selector, self._page_size, token)
            if token is None:
                version = page.resource_version  # the snapshot every page comes from
            for pod in page.items:
                uid = (pod.get("metadata") or {}).get("uid")
                if uid:
                    pods[uid] = pod
            token = page.continue_token
            if not token:
                break
        self.pods = pods
        self.resource_version = version
        self.synced = True
        self.lists += 1
        self._recovered(f"listed {len(pods)} pod(s) at resourceVersion {version}")
        self._on_change()

    async def _watch(self) -> bool:
        """Until the stream ends; True when it delivered at least one event."""
        assert self.resource_version is not None
        # Spread the re-watches of many fleets, as client-go does (timeout in [T, 2T)).
        timeout = int(self._watch_timeout_s * (1 + self._rng.random()))
        progressed = False
        stream = self._api.watch_pods(self.selector, self.resource_version, timeout)
        try:
            async for kind, obj in stream:
                meta = obj.get("metadata") or {}
                version = meta.get("resourceVersion")
                if not version:
                    raise KubeApiError(0, "", f"a {kind} event without resourceVersion")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    uid = meta.get("uid")
                    if not uid:
                        raise KubeApiError(0, "", f"a {kind} event for a pod without uid")
                    if kind == "DELETED":
                        self.pods.pop(uid, None)
                    else:
                        self.pods[uid] = obj
                    self.resource_version = version
                    self._on_change()
                elif kind == "BOOKMARK":
                    self.resource_version = version
                else:
                    log.warning("pod watch %r: unknown event type %r ignored", self.selector, kind)
                    continue
                if not progressed:
                    progressed = True
                    self._recovered("watching")
        finally:
            await stream.aclose()
        return progressed

    def _report(self, exc: KubeApiError) -> None:
        problem = str(exc)
        if problem != self._problem:
            # 4xx other than 410 need an operator (RBAC, a bad selector): say so loudly.
            level = logging.ERROR if 400 <= exc.status < 500 else logging.WARNING
            log.log(
                level,
                "pod watch %r on %s (namespace %s): %s; retrying with backoff",
                self.selector,
                self._api.where,
                self._api.namespace,
                problem,
            )
            self._problem = problem

    def _recovered(self, what: str) -> None:
        if self._problem:
            log.info("pod watch %r recovered: %s", self.selector, what)
            self._problem = ""
        elif what.startswith("listed"):
            log.info("pod watch %r: %s", self.selector, what)
