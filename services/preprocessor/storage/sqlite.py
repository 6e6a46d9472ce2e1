"""The SQLite store (the default): one file under the data folder, created on first start.

Every call runs on one thread of its own, on one connection, so nothing blocks the event
loop and statements never interleave; several preprocessor processes on one host may share
the file (WAL: readers never wait for the writer; a writer waits for another up to the
busy timeout). `synchronous=NORMAL` commits without an fsync (WAL makes that safe against
a crash of the process; a power cut can lose the last commits). `secure_delete` overwrites
what a delete frees, and a checkpoint after deletes moves those pages into the file and
empties the WAL, so deleted content is gone from disk, not only from queries.

A call that outlives its caller (a timeout) is interrupted: SQLite stops the statement and
rolls its transaction back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

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

T = TypeVar("T")
FILE_NAME = "switchyard.db"


class SqliteStore:
    name = "sqlite"

    def __init__(self, path: Path, busy_timeout: float = 5.0) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._thread = _new_thread()
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # the thread and an interrupt() from the loop
        self._running: object | None = None  # the call on the connection now
        self._closed = False

    # --- plumbing ----------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` on the store's thread. Cancelled (its caller's timeout): a call
        still queued never runs, one running is interrupted (and rolled back)."""
        token = object()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, self._call, token, fn, args)
        except asyncio.CancelledError:
            with self._lock:
                if self._running is token and self._conn is not None:
                    self._conn.interrupt()
            raise

    def _call(self, token: object, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        conn = self._conn
        if conn is None:
            raise StoreUnavailable("the SQLite store is closed")
        with self._lock:
            self._running = token
        try:
            return fn(conn, *args)
        except sqlite3.OperationalError as exc:  # locked, I/O error, interrupted, full disk
            if conn.in_transaction:
                conn.rollback()
            raise StoreUnavailable(f"SQLite: {exc}") from None
        finally:
            with self._lock:
                self._running = None

    def _write(self, conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
        """`body` in one write transaction (taken at once: no deadlock between upgrades)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(conn)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        return result

    # --- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        if self._closed:
            self._thread = _new_thread()
            self._closed = False
        await asyncio.get_running_loop().run_in_executor(self._thread, self._open)

    def _open(self) -> None:
        folder = self.path.parent
        if not folder.exists():
            folder.mkdir(mode=0o700, parents=True)
        fresh = not self.path.exists()
        if fresh:  # the file holds users' content: readable by this user alone
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, cached_statements=64
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise StoreUnavailable(f"SQLite: {self.path} cannot use WAL (mode {mode})")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA secure_delete = ON")
            self._migrate(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreUnavailable(f"SQLite: {self.path}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        with self._lock:
            self._conn = conn
        if fresh:
            log.info("created the response store %s", self.path)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")  # one process migrates; the others wait, then see it
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(schema.SQLITE):
                raise StoreUnavailable(
                    f"SQLite: {self.path} has schema version {version}, newer than this "
                    f"release's {len(schema.SQLITE)}"
                )
            for number, statements in enumerate(schema.SQLITE[version:], version + 1):
                for statement in statements:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {number}")
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    async def close(self) -> None:
        def close(conn: sqlite3.Connection) -> None:
            with self._lock:
                self._conn = None
            conn.close()

        if self._conn is not None:
            await self._run(close)
        self._thread.shutdown(wait=False)
        self._closed = True

    async def ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    # --- responses ---------------------------------------------------------------------------

    async def put_response(
        self,
        response: StoredResponse,
        appended: Sequence[StoredItem] = (),
        touch: float | None = None,
    ) -> bool:
        def put(conn: sqlite3.Connection) -> bool:
            conn.execute(sql.INSERT_RESPONSE, response.row())
            conversation = response.conversation_id
            if conversation is None:
                return True
            found = conn.execute(
                "SELECT 1 FROM conversations WHERE id = ? AND tenant = ?",
                (conversation, response.tenant),
            ).fetchone()
            if found is None:
                return False
            _append(conn, conversation, appended, touch)
            return True

        if response.conversation_id is None:  # one statement: its own transaction
            row = response.row()
            await self._run(lambda conn: conn.execute(sql.INSERT_RESPONSE, row))
            return True
        return await self._run(self._write, put)

    async def get_response(
        self, tenant: str, response_id: str, now: float
    ) -> StoredResponse | None:
        def get(conn: sqlite3.Connection) -> StoredResponse | None:
            row = conn.execute(sql.SELECT_RESPONSE, (response_id, tenant, now)).fetchone()
            return None if row is None else response_from_row(row)

        return await self._run(get)

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            return conn.execute(sql.DELETE_RESPONSE, (response_id, tenant)).rowcount > 0

        return await self._deleted(await self._run(self._write, delete))

    async def _deleted(self, deleted: bool) -> bool:
        """After a delete: the freed pages (zeroed) into the file, the WAL emptied."""
        if deleted:
            await self._run(_checkpoint)
        return deleted

    # --- conversations -----------------------------------------------------------------------

    async def create_conversation(
        self, conversation: Conversation, items: Sequence[StoredItem]
    ) -> None:
        def create(conn: sqlite3.Connection) -> None:
            conn.execute(sql.INSERT_CONVERSATION, conversation.row())
            _append(conn, conversation.id, items, None)

        await self._run(self._write, create)

    async def get_conversation(
        self, tenant: str, conversation_id: str, now: float
    ) -> Conversation | None:
        return await self._run(_conversation, conversation_id, tenant, now)

    async def update_conversation(
        self, tenant: str, conversation_id: str, metadata: bytes, now: float
    ) -> Conversation | None:
        def update(conn: sqlite3.Connection) -> Conversation | None:
            conn.execute(sql.UPDATE_METADATA, (metadata, conversation_id, tenant, now))
            return _conversation(conn, conversation_id, tenant, now)

        return await self._run(self._write, update)

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            if conn.execute(sql.DELETE_CONVERSATION, (conversation_id, tenant)).rowcount == 0:
                return False
            conn.execute(sql.DELETE_CONVERSATION_ITEMS, (conversation_id,))
            return True

        return await self._deleted(await self._run(self._write, delete))

    async def add_items(
        self,
        tenant: str,
        conversation_id: str,
        items: Sequence[StoredItem],
        now: float,
        touch: float | None = None,
    ) -> bool:
        def add(conn: sqlite3.Connection) -> bool:
            if _conversation(conn, conversation_id, tenant, now) is None:
                return False
            _append(conn, conversation_id, items, touch)
            return True

        return await self._run(self._write, add)

    async def list_items(
        self,
        tenant: str,
        conversation_id: str,
        now: float,
        after: str | None = None,
        limit: int | None = None,
        descending: bool = False,
    ) -> ItemPage | None:
        def page(conn: sqlite3.Connection) -> ItemPage | None:
            if _conversation(conn, conversation_id, tenant, now) is None:
                return None
            args: list[Any] = [conversation_id]
            if after is not None:
                row = conn.execute(sql.ITEM_SEQ, (conversation_id, after)).fetchone()
                if row is None:
                    return ItemPage([], False)
                args.append(row[0])
            if limit is not None:
                args.append(limit + 1)
            query = sql.select_items(after is not None, descending, limit is not None)
            rows = conn.execute(query, args).fetchall()
            more = limit is not None and len(rows) > limit
            return ItemPage([StoredItem(r[0], bytes(r[1])) for r in rows[:limit]], more)

        return await self._run(page)

    async def get_item(
        self, tenant: str, conversation_id: str, item_id: str, now: float
    ) -> StoredItem | None:
        def get(conn: sqlite3.Connection) -> StoredItem | None:
            if _conversation(conn, conversation_id, tenant, now) is None:
                return None
            row = conn.execute(sql.SELECT_ITEM, (conversation_id, item_id)).fetchone()
            return None if row is None else StoredItem(row[0], bytes(row[1]))

        return await self._run(get)

    async def delete_item(
        self, tenant: str, conversation_id: str, item_id: str, now: float
    ) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            if _conversation(conn, conversation_id, tenant, now) is None:
                return False
            return conn.execute(sql.DELETE_ITEM, (conversation_id, item_id)).rowcount > 0

        return await self._deleted(await self._run(self._write, delete))

    # --- retention ---------------------------------------------------------------------------

    async def purge(self, now: float) -> int:
        def purge(conn: sqlite3.Connection) -> int:
            count = conn.execute(sql.PURGE_RESPONSES, (now,)).rowcount
            conn.execute(sql.PURGE_CONVERSATION_ITEMS, (now,))
            return count + conn.execute(sql.PURGE_CONVERSATIONS, (now,)).rowcount

        count = await self._run(self._write, purge)
        await self._deleted(count > 0)
        return count


def _conversation(
    conn: sqlite3.Connection, conversation_id: str, tenant: str, now: float
) -> Conversation | None:
    row = conn.execute(sql.SELECT_CONVERSATION, (conversation_id, tenant, now)).fetchone()
    return None if row is None else conversation_from_row(row)


def _append(
    conn: sqlite3.Connection,
    conversation_id: str,
    items: Sequence[StoredItem],
    touch: float | None,
) -> None:
    conn.executemany(sql.INSERT_ITEM, [(conversation_id, i.id, i.body) for i in items])
    if touch is not None:
        conn.execute(sql.TOUCH_CONVERSATION, (touch, conversation_id))


def _checkpoint(conn: sqlite3.Connection) -> None:
    """Best effort: a reader in another process can hold the WAL; the next one empties it."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()


def _new_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="sqlite-store")
