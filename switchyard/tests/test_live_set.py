"""What `up` logs as the engines it serves: fleet's routable set, followed as it changes."""

from __future__ import annotations

import asyncio
import threading

from switchyard.common.workers import WorkerSpec
from switchyard.fleet.service import FleetService
from switchyard.fleet.source import WorkerSource
from switchyard.live_set import LiveSet, change_text, engines_text
from switchyard.protos.messages import Instance, InstanceAdded, InstanceRemoved, InstanceUpdated


def instance(url: str, iid: int) -> Instance:
    return Instance(
        instance_id=iid, url=url, protocol="vllm", model="m", context_length=1, block_size=16
    )


def test_texts():
    a, b = instance("grpc://a:1", 1), instance("grpc://b:1", 2)
    assert engines_text({2: b, 1: a}) == "grpc://a:1, grpc://b:1"
    assert engines_text({}) == "none routable"
    events = [InstanceAdded(b), InstanceRemoved(1, "grpc://a:1"), InstanceUpdated(b)]
    assert change_text(events) == "+grpc://b:1 -grpc://a:1"
    assert change_text([InstanceUpdated(b)]) == ""


class Prober:
    async def probe(self, spec):
        from switchyard.common.engines import EngineInfo

        return EngineInfo(protocol="vllm", model="m", context_length=1, block_size=16)

    async def retain(self, urls) -> None:
        pass

    async def close(self) -> None:
        pass


def test_follows_fleet_from_a_thread():
    """The first snapshot's engines, then each change that adds or removes one."""
    changes: list[tuple[str, str]] = []
    seen = threading.Event()

    def on_change(text: str, change: str) -> None:
        changes.append((text, change))
        seen.set()

    async def run() -> str:
        fleet = FleetService(
            WorkerSource([WorkerSpec("grpc://127.0.0.1:1")]),
            control="tcp://127.0.0.1:0",
            events="tcp://127.0.0.1:0",
            probe_interval=0.2,
            prober=Prober(),  # type: ignore[arg-type]
        )
        await fleet.start()
        live = LiveSet(fleet.control_endpoint, fleet.events_endpoint, on_change)
        try:
            first = await asyncio.to_thread(live.start)
            await fleet.add_worker(WorkerSpec("grpc://127.0.0.1:2"))
            assert await asyncio.to_thread(seen.wait, 10)
            return first
        finally:
            await asyncio.to_thread(live.stop)
            await fleet.close()

    first = asyncio.run(run())
    assert first == "grpc://127.0.0.1:1"
    assert changes == [("grpc://127.0.0.1:1, grpc://127.0.0.1:2", "+grpc://127.0.0.1:2")]
