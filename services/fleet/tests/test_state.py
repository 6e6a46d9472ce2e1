"""Fleet's state file (issue 38): the admin API's changes survive a restart, the workers file
stays authoritative for its own entries, and a restarted fleet answers at once with the
instance set it stored (re-probing it over one interval), unless the file is stale."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path

import pytest
import yaml
import zmq.asyncio

from switchyard.common import errors
from switchyard.common.engines import EngineInfo
from switchyard.common.errors import EngineError
from switchyard.common.fleet_admin import fleet_admin
from switchyard.common.fleet_client import FleetClient
from switchyard.common.instance_id import instance_id
from switchyard.common.workers import WorkerSpec
from switchyard.fleet.service import FleetService
from switchyard.fleet.source import WorkerSource
from switchyard.fleet.state import FleetState, StateError, StateFile
from switchyard.protos.messages import WorkerAdminRequest

FLAGGED = "grpc://127.0.0.1:1"
ADDED = "grpc://127.0.0.1:2"
INFO = EngineInfo(protocol="vllm", model="m", context_length=100, block_size=16)


class Prober:
    """Answers every probe with INFO while `gate` is set (else times out after 0.1 s, as a
    probe of an engine that does not answer does), and records each probe's time."""

    def __init__(self, open_now: bool = True) -> None:
        self.gate = asyncio.Event()
        if open_now:
            self.gate.set()
        self.probes: list[tuple[str, float]] = []

    async def probe(self, spec: WorkerSpec) -> EngineInfo:
        self.probes.append((spec.url, time.monotonic()))
        try:
            await asyncio.wait_for(self.gate.wait(), 0.1)
        except TimeoutError:
            raise EngineError(errors.TIMEOUT, "no answer", spec.instance_id) from None
        return INFO

    def first_probes(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for url, at in self.probes:
            out.setdefault(url, at)
        return out

    async def retain(self, urls) -> None:
        pass

    async def close(self) -> None:
        pass


def service(
    path: Path, prober: Prober, *, workers=(FLAGGED,), file=None, max_age=60.0, interval=0.2
) -> FleetService:
    return FleetService(
        WorkerSource([WorkerSpec(u) for u in workers], file),
        control="tcp://127.0.0.1:0",
        events="tcp://127.0.0.1:0",
        probe_interval=interval,
        watch_interval=0.05,
        prober=prober,  # type: ignore[arg-type]
        state=StateFile(path),
        state_max_age=max_age,
    )


@contextlib.asynccontextmanager
async def running(fleet: FleetService):
    await fleet.start()
    ctx = zmq.asyncio.Context()

    async def call(action, worker="", entry=None):
        request = WorkerAdminRequest(action=action, worker=worker, entry=entry)
        return await fleet_admin(ctx, fleet.control_endpoint, request)

    try:
        yield call
    finally:
        await fleet.close()
        ctx.term()


async def until(predicate, what: str, deadline: float = 20.0) -> None:
    try:
        async with asyncio.timeout(deadline):
            while not predicate():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def listing(call) -> dict[str, tuple[str, str]]:
    return {w.url: (w.source, w.state) for w in (await call("list")).workers}


async def listing_becomes(call, expected: dict[str, tuple[str, str]]) -> None:
    """The listing reaches `expected` (a worker taken over or resumed is probed first)."""
    seen: dict[str, tuple[str, str]] = {}
    try:
        async with asyncio.timeout(20.0):
            while (seen := await listing(call)) != expected:
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"listing {seen} never became {expected}") from None


class TestStateFile:
    async def test_what_is_written_is_read_back(self, tmp_path):
        big = 2**64 - 5  # instance ids are unsigned 64-bit
        state = FleetState(
            added=(WorkerSpec(ADDED, kv_events="tcp://h:5557", prefill=True, model="x"),),
            drained=((big, FLAGGED),),
            instances=((big, FLAGGED, INFO),),
            version=123,
        )
        first = StateFile(tmp_path / "sub" / "fleet.sqlite")
        assert (await first.load()).heartbeat is None  # a new file (and its folder)
        await first.write(state, 1000.0)
        await first.close()
        second = StateFile(tmp_path / "sub" / "fleet.sqlite")
        saved = await second.load()
        await second.close()
        assert saved.state == state
        assert saved.heartbeat == 1000.0 and saved.age(1010.0) == 10.0

    async def test_the_heartbeat_alone(self, tmp_path):
        file = StateFile(tmp_path / "f.sqlite")
        await file.load()
        await file.write(FleetState(version=7), 1.0)
        await file.touch(5.0)
        await file.close()
        again = StateFile(tmp_path / "f.sqlite")
        saved = await again.load()
        await again.close()
        assert (saved.heartbeat, saved.state.version) == (5.0, 7)

    async def test_a_file_that_is_not_a_database_is_refused(self, tmp_path):
        path = tmp_path / "f.sqlite"
        path.write_bytes(b"this is not SQLite" * 100)
        file = StateFile(path)
        with pytest.raises(StateError, match="cannot use the state file"):
            await file.load()
        await file.close()

    async def test_a_newer_schema_is_refused(self, tmp_path):
        path = tmp_path / "f.sqlite"
        file = StateFile(path)
        await file.load()
        await file.close()
        with sqlite3.connect(path) as db:
            db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', '99')")
        file = StateFile(path)
        with pytest.raises(StateError, match="schema 99"):
            await file.load()
        await file.close()

    async def test_fields_a_later_version_added_are_ignored(self, tmp_path):
        path = tmp_path / "f.sqlite"
        file = StateFile(path)
        await file.load()
        await file.write(FleetState(instances=((1, FLAGGED, INFO),)), 1.0)
        await file.close()
        with sqlite3.connect(path) as db:
            (info,) = db.execute("SELECT info FROM instances").fetchone()
            db.execute("UPDATE instances SET info = ?", (info[:-1] + ', "new_field": 1}',))
        file = StateFile(path)
        saved = await file.load()
        await file.close()
        assert saved.state.instances == ((1, FLAGGED, INFO),)


class TestAdminChangesSurvive:
    async def test_added_workers_and_drain_marks_come_back(self, tmp_path):
        path = tmp_path / "fleet.sqlite"
        async with running(service(path, Prober())) as call:
            assert (await call("add", entry={"url": ADDED, "role": "prefill"})).status == 201
            assert (await call("drain", FLAGGED)).status == 200
        async with running(service(path, Prober())) as call:
            workers = {w.url: w for w in (await call("list")).workers}
            assert (workers[ADDED].source, workers[ADDED].prefill) == ("admin", True)
            assert (workers[FLAGGED].source, workers[FLAGGED].state) == ("flag", "draining")
            assert (await call("resume", FLAGGED)).status == 200
            assert (await call("remove", ADDED)).status == 200
        async with running(service(path, Prober())) as call:
            await listing_becomes(call, {FLAGGED: ("flag", "ready")})

    async def test_the_workers_file_takes_over_a_stored_entry(self, tmp_path):
        path = tmp_path / "fleet.sqlite"
        workers = tmp_path / "workers.yaml"
        workers.write_text("[]")
        async with running(service(path, Prober(), workers=(), file=workers)) as call:
            assert (await call("add", entry=ADDED)).status == 201
        workers.write_text(yaml.safe_dump([ADDED]))  # the operator lists it meanwhile
        fleet = service(path, Prober(), workers=(), file=workers)
        async with running(fleet) as call:
            await listing_becomes(call, {ADDED: ("file", "ready")})
            assert (await call("remove", ADDED)).status == 409  # the file's
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM admin_workers").fetchone() == (0,)


class TestRestoredInstanceSet:
    async def test_a_restarted_fleet_answers_at_once_and_reprobes(self, tmp_path):
        """The restarted fleet held every snapshot until its first probe round: consumers
        waited (and a slow probe dropped an engine). Now it serves the stored set at once
        and re-probes it in batches over one probe interval."""
        path = tmp_path / "fleet.sqlite"
        workers = (FLAGGED, ADDED, "grpc://127.0.0.1:3", "grpc://127.0.0.1:4")
        first = service(path, Prober(), workers=workers)
        async with running(first):
            async with FleetClient(first.control_endpoint, first.events_endpoint) as client:
                await client.start(timeout=10)
                await until(lambda: len(client.instances) == 4, "every instance")
                before = dict(client.instances)
        prober = Prober(open_now=False)  # no probe answers
        second = service(path, prober, workers=workers, interval=1.0)
        async with running(second):
            # The probes were planned when the state was restored, before this: the bound
            # below holds however long the start took (a loaded machine).
            started = time.monotonic()
            assert second.restored == 4
            async with FleetClient(second.control_endpoint, second.events_endpoint) as client:
                await client.start(timeout=10)  # answered: no probe round to wait for
                # The same instances; when they were admitted is the first fleet's to know
                # (a restored instance's admitted_at is 0, unknown: no warm-up cut-off).
                assert {i: unadmitted(x) for i, x in client.instances.items()} == {
                    i: unadmitted(x) for i, x in before.items()
                }
                assert all(x.admitted_at == 0.0 for x in client.instances.values())
                assert client.version is not None and client.version > first.version
                await until(lambda: len(prober.first_probes()) == 4, "every instance probed")
        offsets = sorted(at - started for at in prober.first_probes().values())
        assert offsets[-1] - offsets[0] > 0.3  # in batches, not all at once
        assert offsets[-1] < 1.0 + 0.5  # within one probe interval (and the loop's wake)

    async def test_a_stale_file_restores_admin_changes_only(self, tmp_path):
        path = tmp_path / "fleet.sqlite"
        async with running(service(path, Prober())) as call:
            assert (await call("add", entry=ADDED)).status == 201
        prober = Prober(open_now=False)
        second = service(path, prober, max_age=0.0001)
        await asyncio.sleep(0.01)
        async with running(second) as call:
            assert second.restored == 0
            assert set(await listing(call)) == {FLAGGED, ADDED}
            async with FleetClient(second.control_endpoint, second.events_endpoint) as client:
                await client.start(timeout=10)  # after a probe round, as without a file
                assert prober.probes and not client.instances  # nobody answered it
                prober.gate.set()
                await until(lambda: len(client.instances) == 2, "both probed in")

    async def test_instances_no_longer_configured_are_not_restored(self, tmp_path):
        path = tmp_path / "fleet.sqlite"
        async with running(service(path, Prober(), workers=(FLAGGED, ADDED))):
            await asyncio.sleep(0.3)  # probed and published (and stored)
        second = service(path, Prober(open_now=False), workers=(FLAGGED,))
        async with running(second):
            assert second.restored == 1
            assert [i.instance_id for i in second.instances.values()] == [instance_id(FLAGGED)]


def unadmitted(instance):
    import msgspec

    return msgspec.structs.replace(instance, admitted_at=0.0)


class TestEntryOptions:
    def test_kv_bind_and_topic_survive_the_state_file(self):
        """Issue 32's worker options are kept like the others (an admin-added worker whose
        publisher connects keeps its router endpoint and topic across a fleet restart)."""
        from switchyard.common.workers import parse_worker_entry
        from switchyard.fleet.state import entry

        spec = WorkerSpec("grpc://h:1", kv_bind="tcp://*:5557", kv_topic="engine-a")
        assert parse_worker_entry(entry(spec)) == spec
