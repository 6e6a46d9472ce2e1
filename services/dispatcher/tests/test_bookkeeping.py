"""DispatcherService's bookkeeping around generations (no engines needed)."""

from __future__ import annotations

import asyncio
import logging

from switchyard.common import errors
from switchyard.dispatcher.service import DispatcherService
from switchyard.protos.messages import Instance, InstanceAdded, InstanceRemoved

INSTANCE = Instance(
    instance_id=7,
    url="grpc://127.0.0.1:1",
    protocol="sglang",
    model="m",
    context_length=100,
    block_size=16,
)


class TestDownReports:
    """Issue 14: one engine death logged ~20 "instance reported down" lines: every stream
    that failed on it reported it again."""

    async def test_one_report_per_instance_until_fleet_shows_it_again(self, caplog):
        service = DispatcherService("tcp://127.0.0.1:0", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
        reports = []

        async def report_down(instance_id, kind, detail=""):
            reports.append(instance_id)

        service.fleet.report_down = report_down  # type: ignore[method-assign]
        caplog.set_level(logging.WARNING)
        try:
            for _ in range(20):
                service._report_down(7, errors.CANNOT_CONNECT, "refused")
            await asyncio.sleep(0)
            assert reports == [7]
            service._on_fleet_change([InstanceRemoved(7, INSTANCE.url)])
            service._report_down(7, errors.CANNOT_CONNECT, "refused")
            await asyncio.sleep(0)
            assert reports == [7]  # still the same transition
            service._on_fleet_change([InstanceAdded(INSTANCE)])  # back: a new transition
            service._report_down(7, errors.TIMEOUT, "deadline")
            await asyncio.sleep(0)
            assert reports == [7, 7]
            lines = [r for r in caplog.records if "reporting instance down" in r.getMessage()]
            assert len(lines) == 2
        finally:
            await service.pool.close()
            service._ctx.term()
