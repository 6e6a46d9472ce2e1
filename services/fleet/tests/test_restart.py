"""Fleet restarts and down reports (issue 14): a restarted fleet must not publish a set it has
not probed yet, and a dead instance is logged once per transition, not once per report."""

from __future__ import annotations

import asyncio
import logging

import pytest

from switchyard.common.engines import EngineInfo
from switchyard.common.fleet_client import FleetClient
from switchyard.common.workers import WorkerSpec
from switchyard.fleet.service import FleetService
from switchyard.fleet.source import WorkerSource

URL = "grpc://127.0.0.1:1"
INFO = EngineInfo(protocol="sglang", model="m", context_length=100, block_size=16)


class GatedProber:
    """Answers every probe with INFO once `gate` is set."""

    def __init__(self, open_now: bool = False) -> None:
        self.gate = asyncio.Event()
        if open_now:
            self.gate.set()

    async def probe(self, spec: WorkerSpec) -> EngineInfo:
        await self.gate.wait()
        return INFO

    async def retain(self, urls) -> None:
        pass

    async def close(self) -> None:
        pass


def fleet(prober: GatedProber, control: str, events: str) -> FleetService:
    return FleetService(
        WorkerSource([WorkerSpec(URL)]),
        control=control,
        events=events,
        probe_interval=0.2,
        prober=prober,  # type: ignore[arg-type]
    )


async def until(predicate, what: str, deadline: float = 20.0) -> None:
    async with asyncio.timeout(deadline):
        while not predicate():
            await asyncio.sleep(0.02)


class TestFirstProbeRound:
    async def test_snapshots_wait_for_the_first_probe_round(self):
        prober = GatedProber()
        service = fleet(prober, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
        await service.start()
        try:
            control, events = service.control_endpoint, service.events_endpoint
            early = FleetClient(control, events)
            with pytest.raises(TimeoutError):
                await early.start(timeout=0.5)  # held: nothing probed yet
            prober.gate.set()
            async with FleetClient(control, events) as client:
                await client.start(timeout=10)
                assert [i.url for i in client.instances.values()] == [URL]
        finally:
            await service.close()

    async def test_a_consumer_keeps_its_set_while_a_restarted_fleet_probes(self):
        """The 404 `model_not_found` 1.5 s after fleet was SIGKILLed: the new fleet's first,
        still empty snapshot replaced what every consumer knew."""
        first = fleet(GatedProber(open_now=True), "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
        await first.start()
        control, events = first.control_endpoint, first.events_endpoint
        seen: list[int] = []
        client = FleetClient(control, events, on_change=lambda ev: seen.append(len(ev)))
        try:
            await client.start(timeout=10)
            await until(lambda: len(client.instances) == 1, "the instance")
            version = client.version
            await first.close()
            prober = GatedProber()
            second = fleet(prober, control, events)  # the restart, on the same endpoints
            await second.start()
            try:
                await asyncio.sleep(1.0)  # the client reconnects and asks for a snapshot
                assert len(client.instances) == 1 and client.version == version
                prober.gate.set()
                await until(lambda: client.version != version, "the new fleet's snapshot")
                assert [i.url for i in client.instances.values()] == [URL]
            finally:
                await second.close()
        finally:
            await client.close()


class TestDownReportLog:
    async def test_one_line_per_transition(self, caplog):
        service = fleet(GatedProber(open_now=True), "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
        await service.start()
        try:
            async with FleetClient(service.control_endpoint, service.events_endpoint) as client:
                await client.start(timeout=10)
                await until(lambda: len(client.instances) == 1, "the instance")
                (instance_id,) = client.instances
                with caplog.at_level(logging.DEBUG, logger="switchyard.fleet.service"):
                    for _ in range(20):
                        await client.report_down(instance_id, "cannot_connect", "refused")
                    await until(lambda: not client.instances, "the instance removed")
                    await asyncio.sleep(0.2)  # every report arrived
                lines = [
                    r
                    for r in caplog.records
                    if "instance reported down" in r.getMessage() and r.levelno >= logging.WARNING
                ]
                assert len(lines) == 1
        finally:
            await service.close()
