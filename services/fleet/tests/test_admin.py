"""Fleet's admin API over its control socket, against mock engine processes: list, add,
remove, drain, resume; the workers file stays authoritative for its own entries; every change
reaches consumers as the same instance-diff events as a file edit."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import yaml
import zmq.asyncio

from switchyard.common.fleet_admin import fleet_admin
from switchyard.common.fleet_client import FleetClient
from switchyard.common.instance_id import instance_id
from switchyard.common.workers import WorkerSpec
from switchyard.fleet.service import FleetService
from switchyard.fleet.source import WorkerSource
from switchyard.protos.messages import InstanceRemoved, WorkerAdminRequest


@contextlib.asynccontextmanager
async def fleet(source):
    service = FleetService(
        source,
        control="tcp://127.0.0.1:0",
        events="tcp://127.0.0.1:0",
        probe_interval=0.2,
        watch_interval=0.05,
    )
    await service.start()
    changes: list = []
    client = FleetClient(
        service.control_endpoint, service.events_endpoint, on_change=changes.extend
    )
    ctx = zmq.asyncio.Context()

    async def call(action, worker="", entry=None):
        request = WorkerAdminRequest(action=action, worker=worker, entry=entry)
        return await fleet_admin(ctx, service.control_endpoint, request)

    try:
        await client.start(timeout=10)
        yield call, client, changes
    finally:
        await client.close()
        await service.close()
        ctx.term()


def kinds(changes, iid):
    out = []
    for e in changes:
        got = e.instance_id if isinstance(e, InstanceRemoved) else e.instance.instance_id
        if got == iid:
            out.append(type(e).__name__)
    return out


class TestAdminApi:
    async def test_add_drain_resume_remove(self, make_engine, until):
        flagged, added = await asyncio.gather(make_engine("sglang"), make_engine("vllm"))
        async with fleet(WorkerSource([WorkerSpec(flagged.url)])) as (call, client, changes):
            fid, aid = instance_id(flagged.url), instance_id(added.url)
            await until(lambda: fid in client.instances, "the flagged engine")
            listed = await call("list")
            assert listed.status == 200
            [one] = listed.workers
            assert (one.url, one.source, one.state) == (flagged.url, "flag", "ready")
            assert one.learned is not None and one.learned["protocol"] == "sglang"

            reply = await call("add", entry={"url": added.url, "role": "prefill"})
            assert reply.status == 201 and reply.workers[0].source == "admin"
            assert reply.workers[0].prefill
            await until(lambda: aid in client.instances, "the added engine routable")
            assert client.instances[aid].role == "prefill"
            assert (await call("add", entry=added.url)).status == 409  # already there
            assert (await call("add", entry=flagged.url)).status == 409

            reply = await call("drain", str(aid))
            assert reply.status == 200 and reply.workers[0].state == "draining"
            await until(lambda: aid not in client.instances, "drained: not routable")
            await asyncio.sleep(0.5)  # probe rounds pass: it stays out
            assert aid not in client.instances
            states = {w.url: w.state for w in (await call("list")).workers}
            assert states == {flagged.url: "ready", added.url: "draining"}

            assert (await call("resume", added.url)).status == 200  # by URL works too
            await until(lambda: aid in client.instances, "resumed: routable again")

            assert (await call("remove", str(fid))).status == 409  # the flag's, not ours
            assert (await call("drain", str(fid))).status == 200  # but any may be drained
            await until(lambda: fid not in client.instances, "flagged engine drained")
            assert (await call("remove", str(aid))).status == 200
            await until(lambda: aid not in client.instances, "removed")
            assert [w.url for w in (await call("list")).workers] == [flagged.url]
            assert kinds(changes, aid) == [
                "InstanceAdded", "InstanceRemoved", "InstanceAdded", "InstanceRemoved"
            ]  # fmt: skip
            # (The flagged engine went decode while a prefill worker was listed: Updated.)
            assert kinds(changes, fid)[0] == "InstanceAdded"

    async def test_bad_requests(self, make_engine, until):
        engine = await make_engine("sglang")
        async with fleet(WorkerSource([WorkerSpec(engine.url)])) as (call, client, _):
            assert (await call("add", entry="not a url ::")).status == 400
            assert (await call("add", entry={"url": engine.url, "color": "red"})).status == 400
            assert (await call("add")).status == 400
            assert (await call("drain", "12345")).status == 404
            assert (await call("drain", "what?")).status == 400
            assert (await call("explode", "1")).status == 400

    async def test_the_file_takes_over_an_admin_entry(self, make_engine, tmp_path, until):
        engine = await make_engine("vllm")
        iid = instance_id(engine.url)
        path = tmp_path / "workers.yaml"
        path.write_text("[]")
        async with fleet(WorkerSource([], path)) as (call, client, _):
            assert (await call("add", entry=engine.url)).status == 201
            await until(lambda: iid in client.instances, "added")
            path.write_text(yaml.safe_dump([engine.url]))

            async def source():
                return (await call("list")).workers[0].source

            for _ in range(200):
                if await source() == "file":
                    break
                await asyncio.sleep(0.05)
            assert await source() == "file"
            assert (await call("remove", str(iid))).status == 409  # the file's now
            assert iid in client.instances  # and it never left the routable set

    async def test_a_probe_error_is_listed_from_the_first_failure(self):
        """In the start-up grace (an engine never seen up) the problem is logged at INFO only;
        the list shows it at once, the state still probing."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
            url = f"grpc://127.0.0.1:{sock.getsockname()[1]}"
            async with fleet(WorkerSource([WorkerSpec(url)])) as (call, _, _):
                async with asyncio.timeout(20):
                    while not (worker := (await call("list")).workers[0]).error:
                        await asyncio.sleep(0.05)
                assert worker.state == "probing" and "cannot_connect" in worker.error
