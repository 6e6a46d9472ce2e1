"""Remove and re-add the same engine many times: every re-added engine is probed and routable.

Regression test for issue 11: once in four remove/re-add cycles a re-added engine was logged as
added but never probed. Removing a worker closes the prober's gRPC channel to it; a probe in
flight on that channel then ended with asyncio.CancelledError (grpc.aio cancels the calls of a
channel closed under them), which no handler caught, so the whole probe loop died and nothing
was ever probed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

import yaml

from switchyard.common.fleet_client import FleetClient
from switchyard.common.instance_id import instance_id
from switchyard.fleet.prober import Prober
from switchyard.fleet.service import FleetService
from switchyard.fleet.source import WorkerSource


class CountingProber(Prober):
    """A real prober that says how many probes are in flight."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.in_flight = 0

    async def probe(self, spec):  # type: ignore[no-untyped-def]
        self.in_flight += 1
        try:
            return await super().probe(spec)
        finally:
            self.in_flight -= 1


@contextlib.asynccontextmanager
async def fleet_on(path, prober):
    service = FleetService(
        WorkerSource([], path),
        control="tcp://127.0.0.1:0",
        events="tcp://127.0.0.1:0",
        probe_interval=0.2,
        watch_interval=0.05,
        prober=prober,
    )
    await service.start()
    client = FleetClient(service.control_endpoint, service.events_endpoint)
    try:
        await client.start(timeout=10)
        yield client
    finally:
        await client.close()
        await service.close()


def write(path, urls) -> None:
    path.write_text(yaml.safe_dump(list(urls)))


class TestRemoveReAdd:
    async def test_many_cycles_each_readded_engine_is_routable(self, make_engine, tmp_path, until):
        engine = await make_engine("sglang")
        iid = instance_id(engine.url)
        path = tmp_path / "workers.yaml"
        write(path, [engine.url])
        async with fleet_on(path, CountingProber(1.0)) as client:
            await until(lambda: iid in client.instances, "the engine routable")
            for cycle in range(20):
                write(path, [])
                await until(lambda: iid not in client.instances, f"removal {cycle}")
                write(path, [engine.url])
                await until(lambda: iid in client.instances, f"re-add {cycle} routable")

    async def test_removed_while_its_probe_is_in_flight(self, make_engine, tmp_path, until):
        """The engine is frozen (SIGSTOP) so that a probe hangs on it; the worker is removed
        while that probe is in flight, then re-added and thawed: it must be routable again."""
        engine = await make_engine("vllm")
        iid = instance_id(engine.url)
        path = tmp_path / "workers.yaml"
        write(path, [engine.url])
        prober = CountingProber(timeout=2.0)
        async with fleet_on(path, prober) as client:
            await until(lambda: iid in client.instances, "the engine routable")
            assert engine.process is not None
            for cycle in range(4):
                engine.process.send_signal(signal.SIGSTOP)
                try:
                    await until(lambda: prober.in_flight > 0, f"a probe hanging {cycle}")
                    write(path, [])
                    await until(lambda: iid not in client.instances, f"removal {cycle}")
                    await until(lambda: prober.in_flight == 0, f"the probe over {cycle}")
                finally:
                    engine.process.send_signal(signal.SIGCONT)
                write(path, [engine.url])
                await until(lambda: iid in client.instances, f"re-add {cycle} routable")
                await asyncio.sleep(0)
