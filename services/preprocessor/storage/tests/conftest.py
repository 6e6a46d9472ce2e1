from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from support.postgres import (
    PostgresMissing,
    PostgresServer,
    throwaway_postgres,
)

from switchyard.preprocessor.storage.postgres import PostgresStore
from switchyard.preprocessor.storage.sqlite import FILE_NAME, SqliteStore

_numbers = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the session (a fresh database per test)."""
    try:
        with throwaway_postgres() as server:
            yield server
    except PostgresMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@contextlib.asynccontextmanager
async def fresh_database(server: PostgresServer) -> AsyncIterator[str]:
    """A new empty database on the server (its DSN), dropped at the end."""
    name = f"t{next(_numbers)}"
    admin = await asyncpg.connect(server.dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    try:
        yield server.dsn.replace("/postgres?", f"/{name}?")
    finally:
        if server.pid:
            admin = await asyncpg.connect(server.dsn)
            try:
                await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
            finally:
                await admin.close()


@pytest.fixture
async def postgres_dsn(postgres: PostgresServer) -> AsyncIterator[str]:
    async with fresh_database(postgres) as dsn:
        yield dsn


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, postgres: PostgresServer
) -> AsyncIterator[SqliteStore | PostgresStore]:
    """An opened store of each backend, closed at the end."""
    async with contextlib.AsyncExitStack() as stack:
        if request.param == "sqlite":
            backend: SqliteStore | PostgresStore = SqliteStore(tmp_path / "data" / FILE_NAME)
        else:
            backend = PostgresStore(await stack.enter_async_context(fresh_database(postgres)), 4)
        await backend.open()
        stack.push_async_callback(backend.close)
        yield backend
