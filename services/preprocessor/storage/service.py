"""`Storage`: a backend behind a time bound per call, a health flag, and the retention purge.

What the request path and the object routes call. Every call is bounded by --store-timeout;
a call that fails for the database's sake (down, refused, too slow) marks the store down,
and while it is down every call fails at once (StoreUnavailable: a 503 for the client,
never a hang) until a probe, once a second, gets an answer again. A PostgreSQL server that
cannot be reached at start is retried the same way (the preprocessor serves requests that
store nothing meanwhile); a SQLite file that cannot be opened stops the start.

Times are unix seconds from `clock` (passed in: tests move it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from switchyard.common.loop_histogram import LoopHistogram
from switchyard.preprocessor.storage.config import StoreConfig
from switchyard.preprocessor.storage.errors import StoreUnavailable
from switchyard.preprocessor.storage.interface import (
    Conversation,
    ItemPage,
    Store,
    StoredItem,
    StoredResponse,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
PROBE_INTERVAL_S = 1.0
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


async def bounded(call: Awaitable[T], timeout: float) -> T:
    """`call`'s result within `timeout` seconds, else TimeoutError at once. The call runs in
    a task of its own that is cancelled and left to finish by itself: a driver whose
    cleanup waits on the database (asyncpg sends a cancel request to a server that may be
    frozen) cannot hold up the caller."""
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        task.add_done_callback(_consume)
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_consume)
        raise TimeoutError
    return task.result()


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: no "never retrieved" warning for a detached call


class StoreMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = LoopHistogram(
            "switchyard_store_operation_seconds",
            "time of one call to the response store, by operation",
            _BUCKETS,
            ["op"],
            registry=registry,
        )
        self.errors = Counter(
            "switchyard_store_errors",
            "store calls that failed (unavailable: down, refused or past --store-timeout), "
            "and responses not kept (too_large, unavailable_served)",
            ["op", "reason"],
            registry=registry,
        )
        self.up = Gauge(
            "switchyard_store_up", "1 while the response store answers, else 0", registry=registry
        )
        self.purged = Counter(
            "switchyard_store_purged",
            "expired responses and conversations deleted",
            registry=registry,
        )


class Storage:
    def __init__(
        self,
        backend: Store,
        config: StoreConfig,
        metrics: StoreMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.up = False
        self.reason = "the response store is starting"
        self._opened = False
        self._tasks: list[asyncio.Task[None]] = []
        self._probing: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await bounded(self.backend.open(), max(self.config.timeout, 10.0))
        except (StoreUnavailable, TimeoutError) as exc:
            reason = exc.reason if isinstance(exc, StoreUnavailable) else "no answer at start"
            if self.backend.name == "sqlite":
                raise StoreUnavailable(reason) from None  # a local file: a setup error
            self._down("open", reason)
        else:
            self._opened = True
            self._set_up(True)
            log.info("response store: %s", self.backend.name)
        self._tasks.append(asyncio.create_task(self._purge_loop(), name="store-purge"))

    async def close(self) -> None:
        for task in [*self._tasks, self._probing]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._probing is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._probing
        with contextlib.suppress(StoreUnavailable, TimeoutError):
            await bounded(self.backend.close(), 5.0)

    # --- health ------------------------------------------------------------------------------

    def _set_up(self, up: bool) -> None:
        self.up = up
        if self.metrics is not None:
            self.metrics.up.set(1 if up else 0)

    def _down(self, op: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.errors.labels(op, "unavailable").inc()
        self.reason = f"the response store is unavailable: {reason}"
        if self.up or self._probing is None:
            log.error("response store (%s) unavailable: %s", self.backend.name, reason)
        self._set_up(False)
        if self._probing is None or self._probing.done():
            self._probing = asyncio.create_task(self._probe(), name="store-probe")

    async def _probe(self) -> None:
        while not self.up:
            await asyncio.sleep(PROBE_INTERVAL_S)
            try:
                if self._opened:
                    await bounded(self.backend.ping(), self.config.timeout)
                else:
                    await bounded(self.backend.open(), self.config.timeout)
                    self._opened = True
            except (StoreUnavailable, TimeoutError):
                continue
            self._set_up(True)
            log.info("response store (%s) answers again", self.backend.name)

    async def _call(self, op: str, call: Awaitable[T]) -> T:
        if not self.up:
            if asyncio.iscoroutine(call):
                call.close()
            raise StoreUnavailable(self.reason)
        t0 = time.perf_counter()
        try:
            return await bounded(call, self.config.timeout)
        except TimeoutError:
            self._down(op, f"no answer within {self.config.timeout:g}s")
            raise StoreUnavailable(self.reason) from None
        except StoreUnavailable as exc:
            self._down(op, exc.reason)
            raise StoreUnavailable(self.reason) from None
        finally:
            if self.metrics is not None:
                self.metrics.seconds.labels(op).observe(time.perf_counter() - t0)

    # --- retention ---------------------------------------------------------------------------

    def response_expiry(self, now: float) -> float | None:
        ttl = self.config.responses_ttl
        return now + ttl if ttl else None

    def conversation_expiry(self, now: float) -> float | None:
        ttl = self.config.conversations_ttl
        return now + ttl if ttl else None

    async def purge(self) -> int:
        count = await self._call("purge", self.backend.purge(self.clock()))
        if count:
            log.info("response store: %d expired object(s) deleted", count)
            if self.metrics is not None:
                self.metrics.purged.inc(count)
        return count

    async def _purge_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.purge_interval)
            if self.up:
                with contextlib.suppress(StoreUnavailable):
                    await self.purge()

    # --- the calls ---------------------------------------------------------------------------

    async def put_response(
        self, response: StoredResponse, appended: Sequence[StoredItem] = ()
    ) -> bool:
        touch = None
        if response.conversation_id is not None:
            touch = self.conversation_expiry(self.clock())
        return await self._call(
            "put_response", self.backend.put_response(response, appended, touch)
        )

    async def get_response(self, tenant: str, response_id: str) -> StoredResponse | None:
        call = self.backend.get_response(tenant, response_id, self.clock())
        return await self._call("get_response", call)

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        return await self._call(
            "delete_response", self.backend.delete_response(tenant, response_id)
        )

    async def create_conversation(
        self, conversation: Conversation, items: Sequence[StoredItem]
    ) -> None:
        call = self.backend.create_conversation(conversation, items)
        await self._call("create_conversation", call)

    async def get_conversation(self, tenant: str, conversation_id: str) -> Conversation | None:
        call = self.backend.get_conversation(tenant, conversation_id, self.clock())
        return await self._call("get_conversation", call)

    async def update_conversation(
        self, tenant: str, conversation_id: str, metadata: bytes
    ) -> Conversation | None:
        call = self.backend.update_conversation(tenant, conversation_id, metadata, self.clock())
        return await self._call("update_conversation", call)

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        call = self.backend.delete_conversation(tenant, conversation_id)
        return await self._call("delete_conversation", call)

    async def add_items(
        self, tenant: str, conversation_id: str, items: Sequence[StoredItem]
    ) -> bool:
        now = self.clock()
        touch = self.conversation_expiry(now)
        call = self.backend.add_items(tenant, conversation_id, items, now, touch)
        return await self._call("add_items", call)

    async def list_items(
        self,
        tenant: str,
        conversation_id: str,
        after: str | None = None,
        limit: int | None = None,
        descending: bool = False,
    ) -> ItemPage | None:
        now = self.clock()
        call = self.backend.list_items(tenant, conversation_id, now, after, limit, descending)
        return await self._call("list_items", call)

    async def get_item(self, tenant: str, conversation_id: str, item_id: str) -> StoredItem | None:
        call = self.backend.get_item(tenant, conversation_id, item_id, self.clock())
        return await self._call("get_item", call)

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        call = self.backend.delete_item(tenant, conversation_id, item_id, self.clock())
        return await self._call("delete_item", call)


def open_storage(config: StoreConfig, registry: CollectorRegistry | None = None) -> Storage | None:
    """The configured store (not yet started); None when storage is off."""
    backend: Store
    if config.backend == "none":
        return None
    if config.backend == "postgres":
        from switchyard.preprocessor.storage.postgres import PostgresStore

        assert config.dsn is not None  # StoreConfig checked it
        backend = PostgresStore(config.dsn, config.pool_size, config.timeout)
    else:
        from switchyard.preprocessor.storage.sqlite import SqliteStore

        backend = SqliteStore(config.sqlite_path, config.timeout)
    metrics = StoreMetrics(registry) if registry is not None else None
    return Storage(backend, config, metrics)
