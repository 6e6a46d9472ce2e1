"""Fleet in-process against mock engine processes, real ZMQ sockets on loopback, and a
FleetClient following it."""

import asyncio
import contextlib
import logging

import pytest
import yaml

from switchyard.common.fleet_client import FleetClient
from switchyard.common.workers import WorkerSpec, parse_worker
from switchyard.fleet import service as fleet_service
from switchyard.fleet.service import FleetService
from switchyard.fleet.source import WorkerSource
from switchyard.protos.messages import InstanceRemoved


def write_workers(path, urls) -> None:
    path.write_text(yaml.safe_dump(list(urls)))


@contextlib.asynccontextmanager
async def running(source, free_port, probe_interval=0.2):
    """A started FleetService and a FleetClient synced to it; both closed on exit."""
    service = FleetService(
        source,
        control="tcp://127.0.0.1:0",  # bound by the service: see control_endpoint
        events="tcp://127.0.0.1:0",
        probe_interval=probe_interval,
        probe_timeout=1.0,
        watch_interval=0.05,
    )
    changes: list = []
    await service.start()
    client = FleetClient(
        service.control_endpoint, service.events_endpoint, on_change=changes.extend
    )
    try:
        await client.start(timeout=10)
        yield service, client, changes
    finally:
        await client.close()
        await service.close()


@pytest.fixture
async def engines(make_engine):
    return await asyncio.gather(
        make_engine("sglang", "--model-name", "sg-model", "--block-size", "32"),
        make_engine("vllm", "--model-name", "vl-model", "--context-length", "4096"),
    )


def ids(client):
    return set(client.instances)


def history(changes, instance_id):
    """The kinds of event one instance went through, in order."""
    return [
        type(e).__name__
        for e in changes
        if (e.instance_id if isinstance(e, InstanceRemoved) else e.instance.instance_id)
        == instance_id
    ]


class TestSnapshot:
    async def test_both_engines_with_protocol_and_model(self, engines, tmp_path, free_port, until):
        sg, vl = engines
        path = tmp_path / "workers.yaml"
        write_workers(path, [sg.url, vl.url])
        async with running(WorkerSource([], path), free_port) as (service, client, _):
            await until(lambda: len(client.instances) == 2, "both engines")
            by_url = {i.url: i for i in client.instances.values()}
            assert (by_url[sg.url].protocol, by_url[sg.url].model) == ("sglang", "sg-model")
            assert (by_url[vl.url].protocol, by_url[vl.url].model) == ("vllm", "vl-model")
            assert by_url[sg.url].block_size == 32 and by_url[vl.url].context_length == 4096
            assert {i.role for i in by_url.values()} == {"aggregated"}
            assert client.version == service.version


class TestWorkersFile:
    async def test_edit_adds_and_removes(self, engines, tmp_path, free_port, until):
        sg, vl = engines
        path = tmp_path / "workers.yaml"
        write_workers(path, [sg.url])
        async with running(WorkerSource([], path), free_port) as (_, client, changes):
            await until(lambda: len(client.instances) == 1, "first engine")
            write_workers(path, [sg.url, vl.url])
            await until(lambda: len(client.instances) == 2, "added by the file")
            write_workers(path, [vl.url])
            await until(
                lambda: {i.url for i in client.instances.values()} == {vl.url},
                "removed by the file",
            )
            assert any(isinstance(e, InstanceRemoved) and e.url == sg.url for e in changes)

    async def test_bad_edit_keeps_last_good_list(self, engines, tmp_path, free_port, until):
        sg, vl = engines
        path = tmp_path / "workers.yaml"
        write_workers(path, [sg.url])
        async with running(WorkerSource([], path), free_port) as (_, client, _):
            await until(lambda: len(client.instances) == 1, "first engine")
            path.write_text("- not a url at all ::\n")
            write_workers(path, [sg.url, vl.url])  # a good edit after the bad one still lands
            await until(lambda: len(client.instances) == 2, "recovered edit")

    async def test_prefill_listing_changes_roles(self, engines, tmp_path, free_port, until):
        sg, vl = engines
        path = tmp_path / "workers.yaml"
        write_workers(path, [sg.url, vl.url])
        async with running(WorkerSource([], path), free_port) as (_, client, _):
            await until(lambda: len(client.instances) == 2, "both engines")
            path.write_text(yaml.safe_dump([{"url": sg.url, "role": "prefill"}, vl.url]))
            await until(
                lambda: (
                    {i.url: i.role for i in client.instances.values()}
                    == {sg.url: "prefill", vl.url: "decode"}
                ),
                "roles from the prefill listing",
            )


class TestEngineLiveness:
    async def test_stopped_engine_leaves_and_comes_back_with_same_id(
        self, engines, free_port, until
    ):
        sg, vl = engines
        source = WorkerSource([WorkerSpec(sg.url), WorkerSpec(vl.url)])
        async with running(source, free_port) as (_, client, changes):
            await until(lambda: len(client.instances) == 2, "both engines")
            sg_id = next(i for i, x in client.instances.items() if x.url == sg.url)
            await sg.stop()
            await until(lambda: sg_id not in client.instances, "stopped engine removed")
            await sg.start()
            await until(lambda: sg_id in client.instances, "restarted engine back")
            assert client.instances[sg_id].url == sg.url
            assert history(changes, sg_id) == ["InstanceAdded", "InstanceRemoved", "InstanceAdded"]

    async def test_report_down_removes_at_once_then_reprobe_restores(
        self, engines, free_port, until
    ):
        sg, vl = engines
        source = WorkerSource([WorkerSpec(sg.url), WorkerSpec(vl.url)])
        # A probe interval far beyond the test: only the report can remove the instance.
        async with running(source, free_port, probe_interval=60) as (service, client, changes):
            await until(lambda: len(client.instances) == 2, "both engines")
            vl_id = next(i for i, x in client.instances.items() if x.url == vl.url)
            await client.report_down(vl_id, "cannot_connect", "test")
            await until(lambda: vl_id not in client.instances, "reported instance removed")
            assert ids(client) == set(service.instances)
        # ... and with a short interval, the next probe cycle brings it back.
        async with running(source, free_port) as (_, client, changes):
            await until(lambda: len(client.instances) == 2, "both engines")
            await client.report_down(vl_id, "timeout")
            await until(lambda: "InstanceRemoved" in history(changes, vl_id), "removal")
            await until(lambda: vl_id in client.instances, "re-probed back")
            assert history(changes, vl_id) == ["InstanceAdded", "InstanceRemoved", "InstanceAdded"]


class TestStartupLogging:
    """An engine that never answered yet is waited for (INFO), not reported (WARNING), for
    the start-up grace; after it, the failure is a WARNING, once."""

    async def test_waiting_then_warning(self, free_port, caplog, monkeypatch, until):
        url = f"grpc://127.0.0.1:{free_port()}"  # nobody listens
        source = WorkerSource([parse_worker(url)])
        with caplog.at_level(logging.INFO, logger="switchyard.fleet.service"):
            async with running(source, free_port):
                await until(lambda: "waiting for engine" in caplog.text, "the INFO line")
                assert "probe failed" not in caplog.text
                monkeypatch.setattr(fleet_service, "STARTUP_GRACE_S", 0.0)
                await until(lambda: "probe failed" in caplog.text, "the WARNING")
        warnings = [r for r in caplog.records if "probe failed" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
        waits = [r for r in caplog.records if "waiting for engine" in r.getMessage()]
        assert len(waits) == 1 and waits[0].levelname == "INFO"
