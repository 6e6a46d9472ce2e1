"""Fleet's stored state: what the admin API changed and the instance set fleet last knew, in
an embedded SQLite database, so that a restarted fleet continues where it stopped.

    admin_workers  instance_id, entry    workers the admin API added (the entry as a workers
                                         file would hold it), restored at start
    drained        instance_id, url      drain marks (any source), restored at start
    instances      instance_id, url,     what the last good probe of each worker that was
                   info                  routable (or draining) learned: restored at start when
                                         the state is recent, so that the restarted fleet
                                         answers at once with the set its consumers hold, and
                                         re-probes it over one probe interval
    meta           key, value            schema, version (the last published), heartbeat (unix
                                         time of the last write; fleet touches it every
                                         HEARTBEAT_S while it runs)

SQLite rather than a JSON file: every change is one transaction (an admin change and the set
it changes together), durable against a killed process (WAL), readable with the sqlite3 shell
while fleet runs, and the project's default store for state (other services' stores use it
too). sqlite3 blocks, so every call runs on one thread of its own, in order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import Counter

from switchyard.common.engines import EngineInfo
from switchyard.common.workers import WorkerSpec, parse_worker_entry
from switchyard.fleet.registry import Registry

log = logging.getLogger(__name__)

SCHEMA = 1
HEARTBEAT_S = 10.0
T = TypeVar("T")

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS admin_workers (instance_id TEXT PRIMARY KEY, entry TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS drained (instance_id TEXT PRIMARY KEY, url TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS instances (
    instance_id TEXT PRIMARY KEY, url TEXT NOT NULL, info TEXT NOT NULL
);
"""


class StateError(Exception):
    """The state file cannot be used (unreadable, not a database, a newer schema)."""


@dataclass(frozen=True)
class FleetState:
    """One consistent picture of what fleet keeps (written whole, in one transaction)."""

    added: tuple[WorkerSpec, ...] = ()
    drained: tuple[tuple[int, str], ...] = ()  # (instance id, url)
    instances: tuple[tuple[int, str, EngineInfo], ...] = ()  # (instance id, url, info)
    version: int = 0


@dataclass(frozen=True)
class Saved:
    """What a state file held at start; `heartbeat` None for a new file."""

    state: FleetState
    heartbeat: float | None

    def age(self, now: float) -> float | None:
        return None if self.heartbeat is None else max(0.0, now - self.heartbeat)


def entry(spec: WorkerSpec) -> dict[str, Any]:
    """A worker as a workers file entry (what parse_worker_entry reads back)."""
    out: dict[str, Any] = {"url": spec.url}
    if spec.kv_events:
        out["kv_events"] = spec.kv_events
    if spec.kv_replay:
        out["kv_replay"] = spec.kv_replay
    if spec.kv_bind:
        out["kv_bind"] = spec.kv_bind
    if spec.kv_topic is not None:
        out["kv_topic"] = spec.kv_topic
    if spec.prefill:
        out["role"] = "prefill"
    if spec.model:
        out["model"] = spec.model
    return out


_INFO_FIELDS = {f.name for f in dataclasses.fields(EngineInfo)}


def engine_info(data: Mapping[str, Any]) -> EngineInfo:
    """EngineInfo from its stored fields; fields a later version added are ignored."""
    return EngineInfo(**{k: v for k, v in data.items() if k in _INFO_FIELDS})


class StateFile:
    """The SQLite file at `path` (created with its folder if missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "fleet-state")
        self._db: sqlite3.Connection | None = None
        self._closed = False

    async def _run(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def load(self) -> Saved:
        """Open (or create) the file and read it. StateError when it cannot be used."""
        return await self._run(self._load)

    def write(self, state: FleetState, now: float) -> asyncio.Future[None]:
        """Replace the stored state with `state` (one transaction), heartbeat `now`. Queued
        at once, so writes land in the order they were asked for; await the future for the
        write to be durable."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor, self._write, state, now)

    def touch(self, now: float) -> asyncio.Future[None]:
        """Only the heartbeat: fleet ran until `now` with the state it wrote last."""
        return asyncio.get_running_loop().run_in_executor(self._executor, self._touch, now)

    async def close(self) -> None:
        """After every write already asked for; closing twice is fine."""
        if self._closed:
            return
        self._closed = True
        await self._run(self._close)
        self._executor.shutdown(wait=True)

    # ---- on the state thread --------------------------------------------------------------

    def _load(self) -> Saved:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = self._db = sqlite3.connect(self.path, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: a killed process loses nothing
            db.executescript(_TABLES)
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            schema = int(meta.get("schema", SCHEMA))
            if schema > SCHEMA:
                raise StateError(
                    f"{self.path} has schema {schema}, newer than this fleet's ({SCHEMA})"
                )
            added = []
            for (text,) in db.execute("SELECT entry FROM admin_workers ORDER BY instance_id"):
                try:
                    added.append(parse_worker_entry(json.loads(text), "stored admin worker"))
                except ValueError as exc:
                    log.warning("%s: dropped a stored admin worker: %s", self.path, exc)
            drained = tuple(
                (int(iid), url) for iid, url in db.execute("SELECT instance_id, url FROM drained")
            )
            instances = []
            for iid, url, info in db.execute("SELECT instance_id, url, info FROM instances"):
                try:
                    instances.append((int(iid), url, engine_info(json.loads(info))))
                except (TypeError, ValueError) as exc:
                    log.warning("%s: dropped a stored instance (%s): %s", self.path, url, exc)
            heartbeat = float(meta["heartbeat"]) if "heartbeat" in meta else None
            version = int(meta.get("version", 0))
        except (sqlite3.Error, OSError, ValueError) as exc:
            self._close()
            raise StateError(f"cannot use the state file {self.path}: {exc}") from None
        return Saved(FleetState(tuple(added), drained, tuple(instances), version), heartbeat)

    def _write(self, state: FleetState, now: float) -> None:
        db = self._db
        if db is None:
            return
        rows_added = [(str(s.instance_id), json.dumps(entry(s))) for s in state.added]
        rows_drained = [(str(iid), url) for iid, url in state.drained]
        rows_instances = [
            (str(iid), url, json.dumps(dataclasses.asdict(info)))
            for iid, url, info in state.instances
        ]
        db.execute("BEGIN IMMEDIATE")
        try:
            for table in ("admin_workers", "drained", "instances"):
                db.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed names
            db.executemany("INSERT INTO admin_workers VALUES (?, ?)", rows_added)
            db.executemany("INSERT INTO drained VALUES (?, ?)", rows_drained)
            db.executemany("INSERT INTO instances VALUES (?, ?, ?)", rows_instances)
            _meta(db, {"schema": SCHEMA, "version": state.version, "heartbeat": now})
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _touch(self, now: float) -> None:
        if self._db is not None:
            _meta(self._db, {"heartbeat": now})

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def _meta(db: sqlite3.Connection, values: Mapping[str, object]) -> None:
    db.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [(k, str(v)) for k, v in values.items()],
    )


def state_of(added: Mapping[int, WorkerSpec], registry: Registry, version: int) -> FleetState:
    """What fleet keeps, now: the admin API's workers, the drain marks, the instances that
    are routable or draining with what their last probe learned, the version published."""
    specs = {spec.instance_id: spec for spec in registry.specs}
    known = registry.known()
    return FleetState(
        added=tuple(sorted(added.values(), key=lambda spec: spec.url)),
        drained=tuple(sorted((iid, specs[iid].url) for iid in registry.draining() if iid in specs)),
        instances=tuple((iid, specs[iid].url, known[iid]) for iid in sorted(known) if iid in specs),
        version=version,
    )


class Keeper:
    """Fleet's side of its state file: writes queued in order, a heartbeat every HEARTBEAT_S,
    each outcome counted (`writes`, a Counter labelled by outcome) and a failure logged once
    (fleet keeps serving: its state is only not stored until the file is writable again)."""

    def __init__(self, file: StateFile, writes: Counter) -> None:
        self.file = file
        self._writes = writes
        self._written = 0.0  # monotonic time of the last write or touch
        self._failing = False

    async def load(self) -> Saved:
        return await self.file.load()

    async def close(self) -> None:
        await self.file.close()

    def save(self, state: FleetState) -> asyncio.Future[None]:
        self._written = time.monotonic()
        future = self.file.write(state, time.time())
        future.add_done_callback(self._done)
        return future

    def heartbeat(self) -> None:
        if time.monotonic() - self._written < HEARTBEAT_S:
            return
        self._written = time.monotonic()
        self.file.touch(time.time()).add_done_callback(self._done)

    def _done(self, future: asyncio.Future[None]) -> None:
        error = None if future.cancelled() else future.exception()
        self._writes.labels("failed" if error else "ok").inc()
        if error is not None and not self._failing:
            log.error("cannot write the state file %s: %s", self.file.path, error)
        elif error is None and self._failing:
            log.info("the state file %s is written again", self.file.path)
        self._failing = error is not None
