"""Storage around a real backend: every call bounded by the timeout, a database that stops
answering or goes away fails calls at once (never a hang) until a probe sees it back, a
PostgreSQL server that is down at start is connected (and migrated) once it comes up, a
SQLite file that cannot be opened stops the start, and the purge follows the clock."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry
from support.postgres import PostgresMissing, throwaway_postgres

from switchyard.preprocessor.storage.config import StoreConfig
from switchyard.preprocessor.storage.errors import StoreUnavailable
from switchyard.preprocessor.storage.postgres import PostgresStore
from switchyard.preprocessor.storage.service import Storage, StoreMetrics
from switchyard.preprocessor.storage.sqlite import FILE_NAME, SqliteStore

from .test_backends import response as stored


def response(rid: str = "resp_1", **kw: object):
    """A record kept until deleted (Storage reads with the real clock)."""
    kw.setdefault("expires_at", None)
    return stored(rid, "a", **kw)


TIMEOUT = 0.5


@pytest.fixture
def server():
    """A PostgreSQL server of the test's own (it is paused and stopped)."""
    try:
        with throwaway_postgres() as pg:
            yield pg
    except PostgresMissing as exc:
        pytest.fail(str(exc), pytrace=False)


async def wait_up(storage: Storage, seconds: float = 30.0) -> None:
    async with asyncio.timeout(seconds):
        while not storage.up:
            await asyncio.sleep(0.05)


def config(**kw: object) -> StoreConfig:
    return StoreConfig(**{"backend": "postgres", "dsn": "x", "timeout": TIMEOUT, **kw})


class TestUnavailable:
    async def test_a_frozen_server_fails_calls_fast_then_recovers(self, server):
        registry = CollectorRegistry()
        storage = Storage(PostgresStore(server.dsn, 2), config(), StoreMetrics(registry))
        await storage.start()
        try:
            await storage.put_response(response())
            server.pause()
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable, match="no answer within 0.5s"):
                await storage.get_response("a", "resp_1")
            assert not storage.up
            with pytest.raises(StoreUnavailable):  # down: refused without waiting again
                await storage.get_response("a", "resp_1")
            assert time.monotonic() - t0 < 30  # bounded (no timing claim beyond "no hang")
            assert registry.get_sample_value("switchyard_store_up") == 0
            server.resume()
            await wait_up(storage)
            assert (await storage.get_response("a", "resp_1")) is not None
            assert registry.get_sample_value("switchyard_store_up") == 1
        finally:
            server.resume()
            await storage.close()

    async def test_a_stopped_server_is_unavailable_then_back(self, server):
        storage = Storage(PostgresStore(server.dsn, 2), config())
        await storage.start()
        try:
            server.stop()
            with pytest.raises(StoreUnavailable, match="unavailable"):
                await storage.put_response(response())
            server.start()
            await wait_up(storage)
            await storage.put_response(response("resp_2"))
            assert await storage.get_response("a", "resp_2") is not None
        finally:
            await storage.close()

    async def test_down_at_start_connects_when_it_comes_up(self, server):
        server.stop()
        storage = Storage(PostgresStore(server.dsn, 2), config())
        await storage.start()  # does not raise: the preprocessor serves what stores nothing
        try:
            assert not storage.up
            with pytest.raises(StoreUnavailable):
                await storage.get_response("a", "resp_1")
            server.start()
            await wait_up(storage)
            await storage.put_response(response())  # migrated on connect
            assert await storage.get_response("a", "resp_1") is not None
        finally:
            await storage.close()

    async def test_sqlite_that_cannot_be_opened_stops_the_start(self, tmp_path):
        (tmp_path / "data").write_text("a file where the folder should be")
        backend = SqliteStore(tmp_path / "data" / FILE_NAME)
        storage = Storage(backend, StoreConfig(data_dir=tmp_path / "data"))
        with pytest.raises((StoreUnavailable, OSError)):
            await storage.start()
        await storage.close()


class TestRetention:
    async def test_purge_follows_the_clock(self, tmp_path):
        now = [1_000_000.0]
        cfg = StoreConfig(data_dir=tmp_path, responses_ttl=60.0)
        registry = CollectorRegistry()
        storage = Storage(
            SqliteStore(cfg.sqlite_path), cfg, StoreMetrics(registry), clock=lambda: now[0]
        )
        await storage.start()
        try:
            expires = storage.response_expiry(now[0])
            await storage.put_response(response(expires_at=expires))
            assert await storage.purge() == 0
            now[0] += 61
            assert await storage.get_response("a", "resp_1") is None
            assert await storage.purge() == 1
            assert registry.get_sample_value("switchyard_store_purged_total") == 1
        finally:
            await storage.close()

    def test_no_ttl_keeps_until_deleted(self):
        storage = Storage(SqliteStore(FILE_NAME), StoreConfig(responses_ttl=0))  # type: ignore[arg-type]
        assert storage.response_expiry(5.0) is None
        assert storage.conversation_expiry(5.0) is None
