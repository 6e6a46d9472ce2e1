"""Engine load reports by polling GetLoads, per instance, every `interval` seconds.

Each reply carries one SchedulerLoad per data-parallel rank (`dp_rank`): running and
waiting requests, KV usage, the admission window, queued prefill tokens (SGLang). They land
in EngineLoads, which the workers' `engine` fields are. An instance whose KV-event stream
carries load records (`pushed`) is not polled while they keep coming. An engine answering
UNIMPLEMENTED is not polled again; other failures are retried at the next interval (the
reports go stale meanwhile, and the scorers fall back to the router's own bookkeeping).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

import grpc

from switchyard.common.engines.base import EngineClient
from switchyard.protos.messages import Instance
from switchyard.router.load import EngineLoads

log = logging.getLogger(__name__)

OpenClient = Callable[[Instance], EngineClient]


def _open(instance: Instance) -> EngineClient:
    from switchyard.common.engines.connect import client_for

    return client_for(instance.protocol, instance.url, instance.instance_id)


class LoadPoller:
    def __init__(
        self,
        loads: EngineLoads,
        interval: float,
        *,
        open_client: OpenClient = _open,
        timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"--load-poll-interval must be > 0, got {interval}")
        self.loads = loads
        self.interval = interval
        self._open = open_client
        self._timeout = timeout
        self._clock = clock
        self._tasks: dict[int, tuple[str, asyncio.Task[None]]] = {}
        self._pushed: dict[int, float] = {}  # instance id -> last pushed record (clock)
        self.polls = 0
        self.failures = 0

    def pushed(self, instance_id: int) -> None:
        """A load record arrived on the instance's event stream: no need to poll it."""
        self._pushed[instance_id] = self._clock()

    def apply(self, instances: Mapping[int, Instance]) -> None:
        """Poll exactly these instances (call from inside the event loop)."""
        for iid in [i for i in self._tasks if i not in instances]:
            self._stop(iid)
        for iid, inst in instances.items():
            running = self._tasks.get(iid)
            if running is not None and running[0] == inst.url:
                continue
            if running is not None:
                self._stop(iid)
            task = asyncio.get_running_loop().create_task(self._poll(inst), name=f"loads:{iid}")
            self._tasks[iid] = (inst.url, task)

    async def close(self) -> None:
        tasks = [t for _, t in self._tasks.values()]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop(self, iid: int) -> None:
        _, task = self._tasks.pop(iid)
        task.cancel()
        self._pushed.pop(iid, None)

    async def _poll(self, inst: Instance) -> None:
        iid = inst.instance_id
        client = self._open(inst)
        try:
            while True:
                pushed = self._pushed.get(iid)
                if pushed is None or self._clock() - pushed > 2 * self.interval:
                    if not await self._poll_once(client, iid):
                        return
                await asyncio.sleep(self.interval)
        finally:
            with contextlib.suppress(Exception):
                await client.close()

    async def _poll_once(self, client: EngineClient, iid: int) -> bool:
        """False when the engine has no GetLoads."""
        self.polls += 1
        try:
            reply = await client.stub.GetLoads(  # type: ignore[attr-defined]
                client.proto.GetLoadsRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("instance_id=%d has no GetLoads: not polled", iid)
                return False
            self.failures += 1
            log.debug("GetLoads instance_id=%d failed: %s", iid, exc.code().name)
            return True
        now = self._clock()
        for load in reply.loads:
            self.loads.update((iid, max(0, int(load.dp_rank))), load, now)
        return True
