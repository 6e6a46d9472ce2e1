"""The PostgreSQL store, for preprocessor replicas that share their responses: asyncpg (the
asyncio driver) with a connection pool. Migrations run at start inside a transaction that
holds an advisory lock, so replicas starting together migrate once. A lost connection is
dropped by the pool and made again on the next call; while the server is down every call
fails at once (StoreUnavailable) rather than waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg

from switchyard.preprocessor.storage import schema, sql
from switchyard.preprocessor.storage.errors import StoreUnavailable
from switchyard.preprocessor.storage.interface import (
    Conversation,
    ItemPage,
    StoredItem,
    StoredResponse,
    conversation_from_row,
    response_from_row,
)

log = logging.getLogger(__name__)

MIGRATION_LOCK = 0x5357_5944  # pg_advisory_xact_lock key: one migrating replica at a time
# Failures of the server or the way to it (not of a statement): the store is unavailable.
_DOWN = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.OperatorInterventionError,  # admin shutdown, crash shutdown
    asyncpg.InsufficientResourcesError,  # disk full, out of memory
)

N = sql.numbered
INSERT_RESPONSE = N(sql.INSERT_RESPONSE)
SELECT_RESPONSE = N(sql.SELECT_RESPONSE)
DELETE_RESPONSE = N(sql.DELETE_RESPONSE)
INSERT_CONVERSATION = N(sql.INSERT_CONVERSATION)
SELECT_CONVERSATION = N(sql.SELECT_CONVERSATION)
UPDATE_METADATA = N(sql.UPDATE_METADATA)
TOUCH_CONVERSATION = N(sql.TOUCH_CONVERSATION)
DELETE_CONVERSATION = N(sql.DELETE_CONVERSATION)
DELETE_CONVERSATION_ITEMS = N(sql.DELETE_CONVERSATION_ITEMS)
INSERT_ITEM = N(sql.INSERT_ITEM)
SELECT_ITEM = N(sql.SELECT_ITEM)
ITEM_SEQ = N(sql.ITEM_SEQ)
DELETE_ITEM = N(sql.DELETE_ITEM)
PURGE = [N(sql.PURGE_RESPONSES), N(sql.PURGE_CONVERSATION_ITEMS), N(sql.PURGE_CONVERSATIONS)]
OWNED = N("SELECT 1 FROM conversations WHERE id = ? AND tenant = ? FOR UPDATE")


class PostgresStore:
    name = "postgres"

    def __init__(self, dsn: str, pool_size: int = 10, connect_timeout: float = 5.0) -> None:
        self.dsn = dsn
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self._pool: asyncpg.Pool | None = None

    def _ready(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreUnavailable("PostgreSQL: not connected")
        return self._pool

    async def open(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=self.pool_size,
                timeout=self.connect_timeout,
                # The pool checks a connection is alive when it is handed out after a while
                # idle, and closes connections idle for long (a restarted server's are dead).
                max_inactive_connection_lifetime=60.0,
            )
            async with self._pool.acquire() as conn, conn.transaction():
                await self._migrate(conn)
        except _DOWN as exc:
            await self._drop()
            raise StoreUnavailable(f"PostgreSQL: {_describe(exc)}") from None
        except BaseException:
            await self._drop()
            raise

    async def _drop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()

    async def _migrate(self, conn: asyncpg.Connection) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute("CREATE TABLE IF NOT EXISTS switchyard_schema (version INTEGER)")
        version = await conn.fetchval("SELECT max(version) FROM switchyard_schema") or 0
        if version > len(schema.POSTGRES):
            raise StoreUnavailable(
                f"PostgreSQL: the database has schema version {version}, newer than this "
                f"release's {len(schema.POSTGRES)}"
            )
        for number, statements in enumerate(schema.POSTGRES[version:], version + 1):
            for statement in statements:
                await conn.execute(statement)
            await conn.execute("INSERT INTO switchyard_schema (version) VALUES ($1)", number)
            log.info("PostgreSQL store: schema migrated to version %d", number)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        closing = asyncio.ensure_future(pool.close())
        done, _ = await asyncio.wait({closing}, timeout=5.0)
        if not done or closing.exception() is not None:  # a frozen or vanished server
            closing.cancel()
            pool.terminate()

    @contextlib.asynccontextmanager
    async def _transaction(self, readonly: bool = False) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection in a transaction; the server's failures -> StoreUnavailable."""
        try:
            async with self._ready().acquire() as conn, conn.transaction(readonly=readonly):
                yield conn
        except _DOWN as exc:
            raise StoreUnavailable(f"PostgreSQL: {_describe(exc)}") from None

    async def _fetchrow(self, query: str, *args: Any) -> Any:
        try:
            return await self._ready().fetchrow(query, *args)
        except _DOWN as exc:
            raise StoreUnavailable(f"PostgreSQL: {_describe(exc)}") from None

    async def _execute(self, query: str, *args: Any) -> str:
        try:
            result: str = await self._ready().execute(query, *args)
            return result
        except _DOWN as exc:
            raise StoreUnavailable(f"PostgreSQL: {_describe(exc)}") from None

    async def ping(self) -> None:
        await self._fetchrow("SELECT 1")

    # --- responses ---------------------------------------------------------------------------

    async def put_response(
        self,
        response: StoredResponse,
        appended: Sequence[StoredItem] = (),
        touch: float | None = None,
    ) -> bool:
        conversation = response.conversation_id
        if conversation is None:  # one statement: one round trip, its own transaction
            await self._execute(INSERT_RESPONSE, *response.row())
            return True
        async with self._transaction() as conn:
            await conn.execute(INSERT_RESPONSE, *response.row())
            if await conn.fetchrow(OWNED, conversation, response.tenant) is None:
                return False
            await _append(conn, conversation, appended, touch)
            return True

    async def get_response(
        self, tenant: str, response_id: str, now: float
    ) -> StoredResponse | None:
        row = await self._fetchrow(SELECT_RESPONSE, response_id, tenant, now)
        return None if row is None else response_from_row(row)

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        return _count(await self._execute(DELETE_RESPONSE, response_id, tenant)) > 0

    # --- conversations -----------------------------------------------------------------------

    async def create_conversation(
        self, conversation: Conversation, items: Sequence[StoredItem]
    ) -> None:
        async with self._transaction() as conn:
            await conn.execute(INSERT_CONVERSATION, *conversation.row())
            await _append(conn, conversation.id, items, None)

    async def get_conversation(
        self, tenant: str, conversation_id: str, now: float
    ) -> Conversation | None:
        row = await self._fetchrow(SELECT_CONVERSATION, conversation_id, tenant, now)
        return None if row is None else conversation_from_row(row)

    async def update_conversation(
        self, tenant: str, conversation_id: str, metadata: bytes, now: float
    ) -> Conversation | None:
        query = UPDATE_METADATA + f" RETURNING {sql.CONVERSATION_COLUMNS}"
        row = await self._fetchrow(query, metadata, conversation_id, tenant, now)
        return None if row is None else conversation_from_row(row)

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        async with self._transaction() as conn:
            status = await conn.execute(DELETE_CONVERSATION, conversation_id, tenant)
            if _count(status) == 0:
                return False
            await conn.execute(DELETE_CONVERSATION_ITEMS, conversation_id)
            return True

    async def add_items(
        self,
        tenant: str,
        conversation_id: str,
        items: Sequence[StoredItem],
        now: float,
        touch: float | None = None,
    ) -> bool:
        async with self._transaction() as conn:
            if await conn.fetchrow(SELECT_CONVERSATION, conversation_id, tenant, now) is None:
                return False
            await _append(conn, conversation_id, items, touch)
            return True

    async def list_items(
        self,
        tenant: str,
        conversation_id: str,
        now: float,
        after: str | None = None,
        limit: int | None = None,
        descending: bool = False,
    ) -> ItemPage | None:
        async with self._transaction(readonly=True) as conn:
            if await conn.fetchrow(SELECT_CONVERSATION, conversation_id, tenant, now) is None:
                return None
            args: list[Any] = [conversation_id]
            if after is not None:
                seq = await conn.fetchval(ITEM_SEQ, conversation_id, after)
                if seq is None:
                    return ItemPage([], False)
                args.append(seq)
            if limit is not None:
                args.append(limit + 1)
            query = N(sql.select_items(after is not None, descending, limit is not None))
            rows = await conn.fetch(query, *args)
        more = limit is not None and len(rows) > limit
        return ItemPage([StoredItem(r[0], bytes(r[1])) for r in rows[:limit]], more)

    async def get_item(
        self, tenant: str, conversation_id: str, item_id: str, now: float
    ) -> StoredItem | None:
        if await self.get_conversation(tenant, conversation_id, now) is None:
            return None
        row = await self._fetchrow(SELECT_ITEM, conversation_id, item_id)
        return None if row is None else StoredItem(row[0], bytes(row[1]))

    async def delete_item(
        self, tenant: str, conversation_id: str, item_id: str, now: float
    ) -> bool:
        async with self._transaction() as conn:
            if await conn.fetchrow(SELECT_CONVERSATION, conversation_id, tenant, now) is None:
                return False
            return _count(await conn.execute(DELETE_ITEM, conversation_id, item_id)) > 0

    # --- retention ---------------------------------------------------------------------------

    async def purge(self, now: float) -> int:
        async with self._transaction() as conn:
            responses = _count(await conn.execute(PURGE[0], now))
            await conn.execute(PURGE[1], now)
            return responses + _count(await conn.execute(PURGE[2], now))


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _count(status: str) -> int:
    """The row count of a command status ("DELETE 3")."""
    return int(status.rsplit(" ", 1)[-1])


async def _append(
    conn: asyncpg.Connection,
    conversation_id: str,
    items: Sequence[StoredItem],
    touch: float | None,
) -> None:
    if items:
        await conn.executemany(INSERT_ITEM, [(conversation_id, i.id, i.body) for i in items])
    if touch is not None:
        await conn.execute(TOUCH_CONVERSATION, touch, conversation_id)
