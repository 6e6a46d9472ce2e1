"""--down-after: a routable engine whose probes time out stays routable until that many in a
row; a refused connection (a dead process) takes it out at the first failed probe. Stepped
probe by probe (a scripted prober), and against a real mock engine process frozen with
SIGSTOP then killed."""

from __future__ import annotations

import asyncio
import logging
import signal

from switchyard.common import errors
from switchyard.common.engines import EngineInfo
from switchyard.common.errors import EngineError
from switchyard.common.workers import WorkerSpec
from switchyard.fleet.service import FleetService
from switchyard.fleet.source import WorkerSource

URL = "grpc://127.0.0.1:1"
SPEC = WorkerSpec(URL)
INFO = EngineInfo(protocol="sglang", model="m", context_length=100, block_size=16)
TIMEOUT = EngineError(errors.TIMEOUT, "no answer within 2 s")
REFUSED = EngineError(errors.CANNOT_CONNECT, "ConnectionRefusedError: refused")


class ScriptedProber:
    """Answers each probe with the outcome the test gives it next (an EngineInfo, or an
    EngineError to raise), so that a test steps fleet through probe results."""

    def __init__(self) -> None:
        self.outcomes: asyncio.Queue[EngineInfo | EngineError] = asyncio.Queue()
        self.asked = 0  # probes begun

    async def probe(self, spec: WorkerSpec) -> EngineInfo:
        self.asked += 1
        outcome = await self.outcomes.get()
        if isinstance(outcome, EngineError):
            raise outcome
        return outcome

    async def answer(self, outcome: EngineInfo | EngineError) -> None:
        """Answer the probe in flight; return once fleet applied it (published what changed)
        and began its next probe."""
        await until(lambda: self.asked > 0, "a probe")
        asked = self.asked
        self.outcomes.put_nowait(outcome)
        await until(lambda: self.asked > asked, "the next probe")

    async def retain(self, urls) -> None:
        pass

    async def close(self) -> None:
        pass


async def until(predicate, what: str, deadline: float = 20.0) -> None:
    try:
        async with asyncio.timeout(deadline):
            while not predicate():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def scripted_fleet(prober: ScriptedProber, down_after: int = 3) -> FleetService:
    return FleetService(
        WorkerSource([SPEC]),
        control="tcp://127.0.0.1:0",
        events="tcp://127.0.0.1:0",
        probe_interval=0.01,
        recovery_interval=0.001,
        down_after=down_after,
        prober=prober,  # type: ignore[arg-type]
    )


class TestStepped:
    async def test_timeouts_count_refusals_do_not_wait(self, caplog):
        prober = ScriptedProber()
        with caplog.at_level(logging.WARNING, logger="switchyard.fleet.service"):
            async with scripted_fleet(prober) as service:
                await prober.answer(INFO)
                assert list(service.instances) == [SPEC.instance_id]
                for _ in range(2):
                    await prober.answer(TIMEOUT)
                    assert list(service.instances) == [SPEC.instance_id]
                (status,) = service.worker_statuses()
                assert (status.state, status.error) == ("ready", "timeout: no answer within 2 s")
                await prober.answer(TIMEOUT)  # the third in a row
                assert list(service.instances) == []
                assert service.worker_statuses()[0].state == "down"

                await prober.answer(INFO)
                await prober.answer(INFO)  # --readmit-after 2
                assert list(service.instances) == [SPEC.instance_id]
                await prober.answer(TIMEOUT)
                await prober.answer(INFO)  # the count starts over
                await prober.answer(TIMEOUT)
                await prober.answer(TIMEOUT)
                assert list(service.instances) == [SPEC.instance_id]
                await prober.answer(REFUSED)
                assert list(service.instances) == []
        assert "a routable engine leaves after 3 in a row" in caplog.text

    async def test_down_after_one_takes_it_out_at_the_first_timeout(self):
        prober = ScriptedProber()
        async with scripted_fleet(prober, down_after=1) as service:
            await prober.answer(INFO)
            await prober.answer(TIMEOUT)
            assert list(service.instances) == []


class TestRealEngine:
    async def test_frozen_engine_leaves_after_the_timeouts_killed_one_at_once(
        self, make_engine, until
    ):
        engine = await make_engine("sglang")
        assert engine.process is not None
        service = FleetService(
            WorkerSource([WorkerSpec(engine.url)]),
            control="tcp://127.0.0.1:0",
            events="tcp://127.0.0.1:0",
            probe_interval=0.2,
            probe_timeout=0.5,
            recovery_interval=0.1,
            down_after=2,
        )

        def status():
            (one,) = service.worker_statuses()
            return one

        async with service:
            await until(lambda: len(service.instances) == 1, "the engine routable")
            engine.process.send_signal(signal.SIGSTOP)
            try:
                await until(lambda: status().error.startswith("timeout"), "a probe timed out")
                # One timeout of two: still routable, the problem shown by the admin API.
                assert status().state == "ready" and len(service.instances) == 1
                await until(lambda: not service.instances, "the frozen engine taken out")
                assert status().error.startswith("timeout")
            finally:
                engine.process.send_signal(signal.SIGCONT)
            await until(lambda: len(service.instances) == 1, "the engine back")
            engine.process.kill()
            await until(lambda: not service.instances, "the killed engine taken out")
            # A dead process's probe fails outright (refused, reset), which takes an engine
            # out at its first failed probe (TestStepped), not a timeout that would count.
            definite = (errors.CANNOT_CONNECT, errors.DISCONNECTED)
            await until(lambda: status().error.startswith(definite), "the probe's kind")
