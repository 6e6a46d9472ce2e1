"""Engine load reports by polling GetLoads, per instance, every `interval` seconds.

Each reply carries one SchedulerLoad per data-parallel rank (`dp_rank`): running and
waiting requests, KV usage, the admission window, queued prefill tokens (SGLang). They land
in EngineLoads, which the workers' `engine` fields are. An instance whose KV-event stream
carries load records (`pushed`) is not polled while they keep coming. An engine answering
UNIMPLEMENTED is not polled again; other failures are retried at the next interval (the
reports go stale meanwhile, and the scorers fall back to the router's own bookkeeping).

Polls go over each engine client's own HTTP/2 connection (EngineClient._unary), not
through gRPC core, which cost about twice the CPU per poll. One timer polls every instance at once
(a new instance is polled when it appears, then on the shared tick): a process wake-up costs
far more than a GetLoads, so N engines cost one wake-up per interval, not N. A poll still
under way at the next tick (an engine slower than the interval) is not started again; a slow
engine never delays the others' polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc

from switchyard.common.engines.base import EngineClient
from switchyard.common.engines.tls import EngineTls
from switchyard.common.errors import EngineError
from switchyard.protos.messages import Instance
from switchyard.router.load import EngineLoads

log = logging.getLogger(__name__)

OpenClient = Callable[[Instance], EngineClient]


def poll_clients(tls: EngineTls | None = None) -> OpenClient:
    """Clients for the polls: on HTTP/2 streams, so GetLoads goes over EngineClient._unary."""
    from switchyard.common.engines.connect import client_for

    def open_client(instance: Instance) -> EngineClient:
        return client_for(
            instance.protocol, instance.url, instance.instance_id, tls, http2_streams=True
        )

    return open_client


@dataclass(slots=True)
class _Target:
    url: str
    client: EngineClient
    polling: asyncio.Task[None] | None = None  # the poll under way
    unimplemented: bool = False  # the engine has no GetLoads: never polled again


class LoadPoller:
    def __init__(
        self,
        loads: EngineLoads,
        interval: float,
        *,
        open_client: OpenClient | None = None,
        timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"--load-poll-interval must be > 0, got {interval}")
        self.loads = loads
        self.interval = interval
        self._open = open_client or poll_clients()
        self._timeout = timeout
        self._clock = clock
        self._targets: dict[int, _Target] = {}
        self._pushed: dict[int, float] = {}  # instance id -> last pushed record (clock)
        self._ticker: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()  # clients of removed instances
        self.polls = 0
        self.failures = 0

    def pushed(self, instance_id: int) -> None:
        """A load record arrived on the instance's event stream: no need to poll it."""
        self._pushed[instance_id] = self._clock()

    def apply(self, instances: Mapping[int, Instance]) -> None:
        """Poll exactly these instances (call from inside the event loop)."""
        for iid in [i for i in self._targets if i not in instances]:
            self._stop(iid)
        for iid, inst in instances.items():
            target = self._targets.get(iid)
            if target is not None and target.url == inst.url:
                continue
            if target is not None:
                self._stop(iid)
            target = self._targets[iid] = _Target(inst.url, self._open(inst))
            self._start(iid, target, self._clock())  # a new instance is polled at once
        if self._targets and self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="loads")

    async def close(self) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
        for iid in list(self._targets):
            self._stop(iid)
        closing, self._closing = list(self._closing), set()
        await asyncio.gather(*closing, return_exceptions=True)

    def _stop(self, iid: int) -> None:
        target = self._targets.pop(iid)
        self._pushed.pop(iid, None)
        if target.polling is not None:
            target.polling.cancel()
        task = asyncio.get_running_loop().create_task(self._close_client(target))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_client(target: _Target) -> None:
        if target.polling is not None:
            await asyncio.gather(target.polling, return_exceptions=True)
        with contextlib.suppress(Exception):
            await target.client.close()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            now = self._clock()
            for iid, target in self._targets.items():
                self._start(iid, target, now)

    def _start(self, iid: int, target: _Target, now: float) -> None:
        if target.unimplemented or target.polling is not None:
            return
        pushed = self._pushed.get(iid)
        if pushed is not None and now - pushed <= 2 * self.interval:
            return
        target.polling = asyncio.get_running_loop().create_task(
            self._poll_once(target, iid), name=f"loads:{iid}"
        )

    async def _poll_once(self, target: _Target, iid: int) -> None:
        self.polls += 1
        client = target.client
        try:
            reply = await client.get_loads(self._timeout)
        except EngineError as exc:
            if exc.code == grpc.StatusCode.UNIMPLEMENTED:
                log.info("instance_id=%d has no GetLoads: not polled", iid)
                target.unimplemented = True
            else:
                self.failures += 1
                log.debug("GetLoads instance_id=%d failed: %s", iid, exc.message)
            return
        except Exception:  # retried at the next tick, as a failed call is
            self.failures += 1
            log.debug("GetLoads instance_id=%d failed", iid, exc_info=True)
            return
        finally:
            target.polling = None
        now = self._clock()
        for load in reply.loads:
            self.loads.update((iid, max(0, int(load.dp_rank))), load, now)
