"""The FastAPI app behind the edge with a real SQLite store and two client keys, for the
stored-object routes' tests (no engine: these routes never reach one)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from switchyard.preprocessor.app import create_app
from switchyard.preprocessor.auth import Access, KeyRing
from switchyard.preprocessor.edge import Edge
from switchyard.preprocessor.state import PreprocessorConfig, PreprocessorState
from switchyard.preprocessor.storage.config import StoreConfig

KEYS = ("sk-alice", "sk-bob")


async def stored_app(
    folder: Path, **store: object
) -> AsyncIterator[tuple[dict[str, httpx.AsyncClient], PreprocessorState]]:
    """One client per key (by key) over one app whose store is started and closed here, and
    the app's state."""
    state = PreprocessorState(
        PreprocessorConfig(
            routers=["tcp://127.0.0.1:1"],
            dispatchers=["tcp://127.0.0.1:2"],
            fleet_control="tcp://127.0.0.1:3",
            fleet_events="tcp://127.0.0.1:4",
            store=StoreConfig(data_dir=folder, **store),  # type: ignore[arg-type]
        )
    )
    assert state.storage is not None
    await state.storage.start()
    edge = Edge(create_app(state), None, 1 << 20, access=Access(KeyRing(KEYS)))
    transport = httpx.ASGITransport(edge)
    clients = {
        key: httpx.AsyncClient(
            transport=transport, base_url="http://t", headers={"authorization": f"Bearer {key}"}
        )
        for key in KEYS
    }
    try:
        yield clients, state
    finally:
        for client in clients.values():
            await client.aclose()
        await state.storage.close()
        await state.dispatcher.close()
        await state.router.close()
        await state.fleet.close()
