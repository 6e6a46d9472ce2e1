"""What is SQLite's own: the file and its folder made on first start (private), WAL, deleted
content gone from the disk, a call interrupted when its caller gives up, a locked database
reported as unavailable, a schema newer than the code refused."""

from __future__ import annotations

import asyncio
import sqlite3
import stat

import orjson
import pytest

from switchyard.preprocessor.storage.errors import StoreUnavailable
from switchyard.preprocessor.storage.sqlite import FILE_NAME, SqliteStore

from .test_backends import NOW, response


@pytest.fixture
async def sqlite(tmp_path):
    store = SqliteStore(tmp_path / "data" / FILE_NAME, busy_timeout=0.2)
    await store.open()
    yield store
    await store.close()


class TestFirstStart:
    async def test_private_folder_and_file_in_wal_mode(self, sqlite, tmp_path):
        folder = tmp_path / "data"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE((folder / FILE_NAME).stat().st_mode) == 0o600
        conn = sqlite3.connect(folder / FILE_NAME)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        conn.close()

    async def test_newer_schema_is_refused(self, tmp_path):
        path = tmp_path / FILE_NAME
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA user_version = 99")
        conn.close()
        store = SqliteStore(path)
        with pytest.raises(StoreUnavailable, match="schema version 99"):
            await store.open()
        await store.close()


class TestDeletion:
    async def test_deleted_content_is_gone_from_disk(self, sqlite, tmp_path):
        marker = b"unmistakable-secret-4f1c"
        kept = response(body=orjson.dumps({"text": marker.decode()}))
        await sqlite.put_response(kept)

        def on_disk() -> bool:
            return any(marker in p.read_bytes() for p in (tmp_path / "data").iterdir())

        assert on_disk()  # the test can see it while it is stored
        assert await sqlite.delete_response("a", "resp_1")
        assert not on_disk()


class TestFaults:
    async def test_a_cancelled_call_is_interrupted(self, sqlite):
        def slow(conn: sqlite3.Connection) -> int:
            query = (
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000000000)"
                " SELECT count(*) FROM c"
            )
            return int(conn.execute(query).fetchone()[0])

        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await sqlite._run(slow)
        # the connection is free again at once (the statement was stopped, not awaited)
        async with asyncio.timeout(10):
            await sqlite.put_response(response())
        assert await sqlite.get_response("a", "resp_1", NOW) is not None

    async def test_a_database_locked_by_another_writer_is_unavailable(self, sqlite, tmp_path):
        other = sqlite3.connect(tmp_path / "data" / FILE_NAME, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(StoreUnavailable, match="locked"):
                await sqlite.put_response(response())
        finally:
            other.rollback()
            other.close()
        await sqlite.put_response(response())  # free again

    async def test_two_connections_share_the_file(self, sqlite, tmp_path):
        """Several preprocessor processes on one host may share the store."""
        second = SqliteStore(tmp_path / "data" / FILE_NAME)
        await second.open()
        try:
            await sqlite.put_response(response())
            assert await second.get_response("a", "resp_1", NOW) is not None
        finally:
            await second.close()
