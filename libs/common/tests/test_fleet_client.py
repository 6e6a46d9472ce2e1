"""FleetClient against a fake fleet speaking the real wire (ROUTER + XPUB, msgpack codec)."""

import asyncio
import contextlib
from types import MappingProxyType

import pytest
import zmq
import zmq.asyncio

from switchyard.common.fleet_client import FleetClient
from switchyard.common.instance_id import instance_id
from switchyard.common.ports import free_port
from switchyard.protos import codec
from switchyard.protos.messages import (
    Ack,
    FleetUpdate,
    Instance,
    InstanceAdded,
    InstanceDownReport,
    InstanceRemoved,
    Snapshot,
    SnapshotRequest,
)

DEADLINE = 10.0


def inst(port: int, model: str = "m") -> Instance:
    url = f"grpc://127.0.0.1:{port}"
    return Instance(
        instance_id=instance_id(url),
        url=url,
        protocol="vllm",
        model=model,
        context_length=2048,
        block_size=16,
    )


A, B, C = inst(1001), inst(1002), inst(1003)


async def until(predicate, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def try_bind(sock: zmq.Socket, endpoint: str) -> bool:
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        if exc.errno != zmq.EADDRINUSE:
            raise
        return False
    return True


class FakeFleet:
    """Answers SnapshotRequest with `snapshot`, records down reports, publishes on demand."""

    def __init__(self, ctx: zmq.asyncio.Context, control_port: int, events_port: int) -> None:
        self.router = ctx.socket(zmq.ROUTER)
        self.xpub = ctx.socket(zmq.XPUB)
        self.control = f"tcp://127.0.0.1:{control_port}"
        self.events = f"tcp://127.0.0.1:{events_port}"
        self.snapshot = Snapshot(0, [])
        self.snapshot_requests = 0
        self.reports: list[InstanceDownReport] = []
        self.subscribers = 0
        self.tasks: list[asyncio.Task] = []

    async def start(self) -> "FakeFleet":
        # ZMQ releases a port asynchronously after close: a restarted fake may need a retry.
        await until(lambda: try_bind(self.router, self.control), "control port")
        await until(lambda: try_bind(self.xpub, self.events), "events port")
        self.tasks = [asyncio.create_task(self._serve()), asyncio.create_task(self._subs())]
        return self

    async def _serve(self) -> None:
        while True:
            identity, payload = await self.router.recv_multipart()
            request = codec.fleet_control_request.decode(payload)
            if isinstance(request, SnapshotRequest):
                self.snapshot_requests += 1
                reply = self.snapshot
            else:
                self.reports.append(request)
                reply = Ack()
            await self.router.send_multipart([identity, codec.encode(reply)])

    async def _subs(self) -> None:
        while True:
            frame = await self.xpub.recv()
            if frame[:1] == b"\x01":
                self.subscribers += 1

    async def publish(self, version: int, events) -> None:
        await self.xpub.send(codec.encode(FleetUpdate(version, list(events))))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.router.close(linger=0)
        self.xpub.close(linger=0)


@pytest.fixture
async def ctx():
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)  # a failed test must not hang on a socket it left open


@pytest.fixture
def ports():
    return free_port(), free_port()


@pytest.fixture
async def fleet(ctx, ports):
    fake = FakeFleet(ctx, *ports)
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def started(fleet, ports):
    """A client synced to `fleet` at version 10 holding A and B; yields (client, changes)."""
    fleet.snapshot = Snapshot(10, [A, B])
    changes: list = []
    client = FleetClient(*(f"tcp://127.0.0.1:{p}" for p in ports), on_change=changes.append)
    try:
        await client.start(timeout=DEADLINE)
        await until(lambda: fleet.subscribers >= 1, "subscription")
        yield client, changes
    finally:
        await client.close()


class TestStart:
    async def test_snapshot_becomes_added_events(self, started):
        client, changes = started
        assert client.version == 10
        assert dict(client.instances) == {A.instance_id: A, B.instance_id: B}
        assert isinstance(client.instances, MappingProxyType)
        assert changes[0] == [InstanceAdded(A), InstanceAdded(B)]

    async def test_waits_for_a_fleet_that_starts_late(self, ctx, ports):
        client = FleetClient(*(f"tcp://127.0.0.1:{p}" for p in ports))
        starting = asyncio.create_task(client.start())
        fake = None
        try:
            await asyncio.sleep(0.3)  # let the first request go unanswered
            assert not starting.done()
            fake = FakeFleet(ctx, *ports)
            fake.snapshot = Snapshot(3, [C])
            await fake.start()
            await asyncio.wait_for(starting, DEADLINE)
            assert list(client.instances) == [C.instance_id]
        finally:
            starting.cancel()
            await client.close()
            if fake is not None:
                await fake.close()

    async def test_timeout(self, ports):
        client = FleetClient(*(f"tcp://127.0.0.1:{p}" for p in ports))
        with pytest.raises(TimeoutError):
            await client.start(timeout=0.3)
        await client.close()  # idempotent after the failed start


class TestUpdates:
    async def test_applied_in_order_and_snapshot_is_immutable(self, started, fleet):
        client, changes = started
        held = client.instances
        await fleet.publish(11, [InstanceAdded(C)])
        await fleet.publish(12, [InstanceRemoved(A.instance_id, A.url)])
        await until(lambda: client.version == 12, "version 12")
        assert set(client.instances) == {B.instance_id, C.instance_id}
        assert set(held) == {A.instance_id, B.instance_id}
        assert changes[1:] == [[InstanceAdded(C)], [InstanceRemoved(A.instance_id, A.url)]]

    async def test_stale_update_skipped(self, started, fleet):
        client, changes = started
        await fleet.publish(9, [InstanceAdded(C)])  # older than the snapshot
        await fleet.publish(11, [InstanceRemoved(B.instance_id, B.url)])
        await until(lambda: client.version == 11, "version 11")
        assert set(client.instances) == {A.instance_id}

    async def test_gap_resyncs_and_reports_difference(self, started, fleet):
        client, changes = started
        requests = fleet.snapshot_requests
        fleet.snapshot = Snapshot(14, [B, C])
        await fleet.publish(13, [InstanceAdded(C)])  # 11 and 12 were missed
        await until(lambda: client.version == 14, "resync to 14")
        assert fleet.snapshot_requests > requests
        assert set(client.instances) == {B.instance_id, C.instance_id}
        assert changes[-1] == [InstanceRemoved(A.instance_id, A.url), InstanceAdded(C)]

    async def test_restarted_fleet_version_going_down_resyncs(self, started, fleet):
        client, changes = started
        await fleet.publish(11, [InstanceAdded(C)])
        await until(lambda: client.version == 11, "version 11")
        fleet.snapshot = Snapshot(2, [C])
        await fleet.publish(2, [InstanceAdded(C)])  # a new fleet counting from 1
        await until(lambda: client.version == 2, "resync to 2")
        assert list(client.instances) == [C.instance_id]
        assert changes[-1] == [
            InstanceRemoved(A.instance_id, A.url),
            InstanceRemoved(B.instance_id, B.url),
        ]

    async def test_reconnect_to_restarted_fleet_resyncs_without_any_update(
        self, started, fleet, ctx, ports
    ):
        client, changes = started
        await fleet.close()
        fresh = FakeFleet(ctx, *ports)
        try:
            fresh.snapshot = Snapshot(1, [C])
            await fresh.start()
            await until(lambda: client.version == 1, "resync after reconnect")
            assert list(client.instances) == [C.instance_id]
        finally:
            await fresh.close()

    async def test_callback_error_does_not_stop_reader(self, fleet, ports):
        fleet.snapshot = Snapshot(1, [A])

        def boom(events):
            raise RuntimeError("consumer bug")

        client = FleetClient(*(f"tcp://127.0.0.1:{p}" for p in ports), on_change=boom)
        try:
            await client.start(timeout=DEADLINE)
            await until(lambda: fleet.subscribers >= 1, "subscription")
            await fleet.publish(2, [InstanceAdded(B)])
            await until(lambda: client.version == 2, "version 2")
        finally:
            await client.close()


class TestReportDown:
    async def test_reaches_fleet(self, started, fleet):
        client, _ = started
        await client.report_down(A.instance_id, "cannot_connect", "refused")
        await until(lambda: fleet.reports, "report")
        assert fleet.reports == [InstanceDownReport(A.instance_id, "cannot_connect", "refused")]
