"""Fleet's main loop: owns the routable instance set and tells everyone about changes.

    control  ROUTER  SnapshotRequest -> Snapshot, InstanceDownReport -> Ack,
                     WorkerAdminRequest -> WorkerAdminReply (the admin API, see admin.py)
    events   PUB     FleetUpdate(version, events) whenever the routable set changes

Three tasks share one Registry: the control loop (answers requests, applies down reports at
once), the probe loop (re-probes every configured worker concurrently each probe interval,
sooner when workers were added) and the file watch loop (polls the workers file every
second); with a Kubernetes pod source, a fourth applies each change of the Ready pods. Every
change goes through `_publish`, which diffs the routable list against the
last published one. Versions start at the startup time in microseconds, so a restarted
fleet continues above its predecessor and consumers see a gap, not stale versions.

Until its first probe round is done, fleet publishes nothing and holds snapshot requests
(answered once the round is done): a restarted fleet must not hand its consumers an empty
set it has not probed yet, or every model would vanish from them for a moment.

With a state file (state.py), fleet keeps the admin API's changes and the instance set it
publishes there. At start it restores the admin's workers and drain marks; and when the file
is recent (written within `state_max_age`), the instance set too: it answers snapshots at
once with the set its consumers hold, and re-probes the restored instances spread over one
probe interval instead of all at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

import msgspec
import zmq
import zmq.asyncio

from switchyard.common import errors
from switchyard.common.engines import EngineInfo, connect
from switchyard.common.engines.tls import EngineTls
from switchyard.common.errors import EngineError
from switchyard.common.instance_diff import diff_instances, index_instances
from switchyard.common.ports import PortRange, zmq_bind
from switchyard.common.workers import WorkerSpec
from switchyard.fleet import admin
from switchyard.fleet.k8s.source import PodSource, merge_workers
from switchyard.fleet.metrics import FleetMetrics
from switchyard.fleet.prober import Prober
from switchyard.fleet.registry import Registry
from switchyard.fleet.source import WorkerSource
from switchyard.fleet.state import Keeper, Saved, StateFile, state_of
from switchyard.protos import codec
from switchyard.protos.messages import (
    Ack,
    FleetUpdate,
    Instance,
    InstanceAdded,
    InstanceDownReport,
    InstanceEvent,
    InstanceRemoved,
    Snapshot,
    SnapshotRequest,
    WorkerAdminReply,
    WorkerAdminRequest,
    WorkerStatus,
)

log = logging.getLogger(__name__)

STARTUP_GRACE_S = 30.0  # an engine never seen up: its refusals are logged at INFO this long


POD_LIST_WAIT_S = 30.0
RESTORED_PROBE_BATCHES = 4  # restored instances are re-probed in this many batches
MIN_WAIT_S = 0.01


class FleetService:
    def __init__(
        self,
        source: WorkerSource,
        *,
        control: str,
        events: str,
        probe_interval: float = 2.0,
        probe_timeout: float = 2.0,
        readmit_after: int = 2,
        down_after: int = 3,
        recovery_interval: float = 0.5,
        watch_interval: float = 1.0,
        prober: Prober | None = None,
        context: zmq.asyncio.Context | None = None,
        initial_version: int | None = None,
        ports: PortRange | None = None,
        pods: PodSource | None = None,
        tls: EngineTls | None = None,
        state: StateFile | None = None,
        state_max_age: float = 60.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._wall_clock = wall_clock  # stamps admissions (Instance.admitted_at)
        self._ports = ports  # where a port 0 in `control` / `events` is searched
        self._pods = pods
        self._listed: list[WorkerSpec] = []  # from flags and the workers file
        self._added: dict[int, WorkerSpec] = {}  # by the admin API (see admin.py)
        self._control_endpoint = control
        self._events_endpoint = events
        self._probe_interval = probe_interval
        self._watch_interval = watch_interval
        self._prober = prober or Prober(
            probe_timeout, functools.partial(connect, tls=tls, http2_streams=True)
        )
        self._context = context
        self._own_context = context is None
        self._registry = Registry(readmit_after=readmit_after, down_after=down_after)
        self.metrics = FleetMetrics(self._registry.states, self._registry.worker_states)
        self._state_max_age = state_max_age
        self._keeper = None if state is None else Keeper(state, self.metrics.state_writes)
        self.restored = 0  # instances restored from the state file at start
        # While an instance is down or being re-admitted, probe rounds come this often
        # (but never more often than the normal interval asks).
        self._recovery_interval = min(recovery_interval, probe_interval)
        self._max_backoff = max(probe_interval, 5.0)
        self._next_probe: dict[int, float] = {}  # instance id -> monotonic time
        self._failures: dict[int, int] = {}  # instance id -> consecutive failed probes
        self._version = time.time_ns() // 1000 if initial_version is None else initial_version
        self._published: Mapping[int, Instance] = MappingProxyType({})
        self._failing: dict[int, str] = {}  # instance id -> last probe error logged
        # instance id -> the last probe's problem, shown by the admin API at once (also in the
        # start-up grace, when it is logged at INFO only); cleared when a probe answers
        self._problems: dict[int, str] = {}
        # Engines that never answered yet, and since when: engines start after (or with) fleet,
        # so their first refusals are a wait, not a fault (logged at INFO for STARTUP_GRACE).
        self._first_probe: dict[int, float] = {}
        self._answered: set[int] = set()
        self._wake = asyncio.Event()
        self._probed = False  # the first probe round is done
        self._started_at = time.monotonic()
        self._held: list[list[bytes]] = []  # snapshot requests' envelopes, until then
        self._router: zmq.asyncio.Socket | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def control_endpoint(self) -> str:
        """The control endpoint (bound: a port 0 resolved, once started)."""
        return self._control_endpoint

    @property
    def events_endpoint(self) -> str:
        return self._events_endpoint

    @property
    def version(self) -> int:
        return self._version

    @property
    def instances(self) -> Mapping[int, Instance]:
        """The routable set as last published."""
        return self._published

    async def start(self) -> None:
        """Load the worker list (ValueError/OSError: bad config, StateError: an unusable
        state file), bind, start the loops."""
        self._listed = self._source.load()
        if self._pods is not None:
            await self._pods.start()  # ConfigError (a ValueError): no cluster configuration
        saved = await self._keeper.load() if self._keeper is not None else None
        if saved is not None:
            self._added = {spec.instance_id: spec for spec in saved.state.added}
        specs = self._specs()
        self._registry.configure(specs)
        if saved is not None:
            self._restore(saved)
            self._save()  # what start-up dropped (an entry the file took over) is gone
        log.info(
            "fleet starting: %d worker(s), control %s, events %s",
            len(specs),
            self._control_endpoint,
            self._events_endpoint,
        )
        try:
            if self._context is None:
                self._context = zmq.asyncio.Context()
            self._router = self._context.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._control_endpoint = zmq_bind(self._router, self._control_endpoint, self._ports)
            self._pub = self._context.socket(zmq.PUB)
            self._pub.setsockopt(zmq.LINGER, 0)
            self._events_endpoint = zmq_bind(self._pub, self._events_endpoint, self._ports)
        except BaseException:
            await self.close()
            raise
        self._tasks = [
            asyncio.create_task(self._control_loop(), name="fleet-control"),
            asyncio.create_task(self._probe_loop(), name="fleet-probe"),
        ]
        if self._source.file is not None:
            self._tasks.append(asyncio.create_task(self._watch_loop(), name="fleet-watch"))
        if self._pods is not None:
            self._tasks.append(asyncio.create_task(self._pods_loop(), name="fleet-pods"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._keeper is not None:
            await self._keeper.close()  # after the writes already asked for
        for sock in (self._router, self._pub):
            if sock is not None:
                sock.close(linger=0)
        self._router = self._pub = None
        if self._pods is not None:
            await self._pods.close()
        await self._prober.close()
        if self._own_context and self._context is not None:
            self._context.term()
            self._context = None

    async def __aenter__(self) -> FleetService:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ---- control ------------------------------------------------------------------------

    async def _control_loop(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) < 2:
                continue
            try:
                request = codec.fleet_control_request.decode(frames[-1])
            except msgspec.DecodeError as exc:
                log.warning("undecodable control request: %s", exc)
                continue
            if isinstance(request, SnapshotRequest):
                if not self._probed:
                    self._held.append(frames[:-1])
                    continue
                reply: Snapshot | Ack | WorkerAdminReply = self._snapshot()
            elif isinstance(request, WorkerAdminRequest):
                reply = await self._admin(request)
            else:
                await self._on_down_report(request)
                reply = Ack()
            # Echo the envelope (identity, and the empty delimiter a REQ peer adds).
            await self._router.send_multipart([*frames[:-1], codec.encode(reply)])

    def _snapshot(self) -> Snapshot:
        return Snapshot(self._version, sorted(self._published.values(), key=lambda i: i.url))

    async def _first_round_done(self) -> None:
        self._probed = True
        await self._publish()
        held, self._held = self._held, []
        if held and self._router is not None:
            log.info("first probe round done: answering %d held snapshot request(s)", len(held))
            payload = codec.encode(self._snapshot())
            for envelope in held:
                await self._router.send_multipart([*envelope, payload])

    async def _on_down_report(self, report: InstanceDownReport) -> None:
        already_down = self._registry.is_down(report.instance_id)
        if not self._registry.mark_down(report.instance_id):
            log.info("down report for unknown instance_id=%s ignored", report.instance_id)
            return
        self._next_probe.pop(report.instance_id, None)  # re-probe at the next tick
        # One line per transition: every stream that failed on the instance may report it.
        log.log(
            logging.DEBUG if already_down else logging.WARNING,
            "instance reported down instance_id=%s kind=%s detail=%s",
            report.instance_id,
            report.kind,
            report.detail,
        )
        await self._publish()

    # ---- probing ------------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._probe_all()
            except asyncio.CancelledError:
                if _cancelling():
                    raise
                # Not ours (a gRPC call cancelled under a probe): the loop must go on, or
                # nothing is ever probed again.
                log.exception("probe cycle cancelled from below")
            except Exception:
                log.exception("probe cycle failed")
            if not self._probed and self._pods_listed():
                await self._first_round_done()
            if self._keeper is not None:
                self._keeper.heartbeat()
            interval = self._probe_interval
            if self._registry.recovering() or self._failing:
                interval = self._recovery_interval
            if self._next_probe:  # e.g. restored instances, due within the interval
                due = min(self._next_probe.values()) - time.monotonic()
                interval = min(interval, max(MIN_WAIT_S, due))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()

    async def _probe_all(self) -> None:
        round_ = self._registry.start_round()
        now = time.monotonic()
        specs = [s for s in self._registry.specs if self._next_probe.get(s.instance_id, 0) <= now]
        results = await asyncio.gather(*(self._probe_one(spec) for spec in specs))
        for spec, (info, timed_out) in zip(specs, results, strict=True):
            if not self._registry.has(spec.instance_id):
                continue  # removed while its probe was in flight: no state left behind
            self._registry.record(spec.instance_id, round_, info, self._wall_clock(), timed_out)
            self._schedule(spec.instance_id, info is not None, now)
        await self._prober.retain({spec.url for spec in self._registry.specs})
        await self._publish()

    def _schedule(self, instance_id: int, answered: bool, now: float) -> None:
        """When to probe an instance next: at the normal interval once it is routable, every
        recovery tick while it is being re-admitted, with a doubling backoff while it fails."""
        if not answered:
            failures = self._failures.get(instance_id, 0) + 1
            self._failures[instance_id] = failures
            backoff = self._recovery_interval * 2 ** (failures - 1)
            self._next_probe[instance_id] = now + min(backoff, self._max_backoff)
            return
        self._failures.pop(instance_id, None)
        routable = any(i.instance_id == instance_id for i in self._registry.routable())
        self._next_probe[instance_id] = now + (self._probe_interval if routable else 0.0)

    async def _probe_one(self, spec: WorkerSpec) -> tuple[EngineInfo | None, bool]:
        """(what the engine reported, None when the probe failed; whether it failed for
        want of an answer in time, which counts toward --down-after)."""
        timed_out = False
        try:
            info = await self._prober.probe(spec)
        except EngineError as exc:
            problem = f"{exc.kind}: {exc.message}"
            timed_out = exc.kind == errors.TIMEOUT
        except Exception as exc:  # a malformed answer must not stop the other probes
            problem = f"{type(exc).__name__}: {exc}"
        else:
            self._failing.pop(spec.instance_id, None)
            self._problems.pop(spec.instance_id, None)
            self._answered.add(spec.instance_id)
            self.metrics.probes.labels("ok").inc()
            return info, False
        self.metrics.probes.labels("failed").inc()
        self._problems[spec.instance_id] = problem
        first = self._first_probe.setdefault(spec.instance_id, time.monotonic())
        starting = (
            spec.instance_id not in self._answered and time.monotonic() - first < STARTUP_GRACE_S
        )
        # Each problem logged once: at INFO while the engine is still starting, and at WARNING
        # once that no longer explains it.
        logged = self._failing.get(spec.instance_id)
        if starting and logged is None:
            log.info("waiting for engine url=%s to answer (%s)", spec.url, problem)
            self._failing[spec.instance_id] = ""  # probe fast, as for any failing engine
        elif not starting and logged != problem:
            down_after = self._registry.down_after
            log.warning(
                "probe failed url=%s instance_id=%s: %s%s",
                spec.url,
                spec.instance_id,
                problem,
                f" (a routable engine leaves after {down_after} in a row)"
                if timed_out and down_after > 1
                else "",
            )
            self._failing[spec.instance_id] = problem
        return None, timed_out

    # ---- workers file -------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(self._watch_interval)
            try:
                specs = await asyncio.to_thread(self._source.poll)
                if specs is not None:
                    self._listed = specs
                    await self._configure(self._specs(), "workers file")
            except Exception:
                log.exception("workers file check failed")

    def _pods_listed(self) -> bool:
        """The first round counts once every pod selector was listed (a fleet restarted on
        Kubernetes must not publish its flag-only set); an API server that does not answer
        holds it back POD_LIST_WAIT_S at most."""
        if self._pods is None or self._pods.synced:
            return True
        return time.monotonic() - self._started_at > POD_LIST_WAIT_S

    async def _pods_loop(self) -> None:
        assert self._pods is not None
        while True:
            await self._pods.wait_changed()
            try:
                await self._configure(self._specs(), "Ready pods")
            except Exception:
                log.exception("applying the pod list failed")

    def _specs(self) -> list[WorkerSpec]:
        """Flags and file, then the pods, then the admin API's: each URL from the first."""
        base = (
            self._listed
            if self._pods is None
            else merge_workers(self._listed, self._pods.workers())
        )
        if not self._added:
            return base
        taken = {spec.instance_id for spec in base}
        for iid in [i for i in self._added if i in taken]:
            log.info(
                "worker %s added by the admin API is now listed elsewhere: theirs",
                self._added[iid].url,
            )
            del self._added[iid]
        return sorted([*base, *self._added.values()], key=lambda spec: spec.url)

    def source_of(self, spec: WorkerSpec) -> str:
        if spec.instance_id in self._added:
            return admin.ADMIN
        if spec.instance_id in self._source.static_ids():
            return admin.FLAG
        if any(s.instance_id == spec.instance_id for s in self._listed):
            return admin.FILE
        return admin.PODS

    def worker_statuses(self) -> list[WorkerStatus]:
        out = []
        for spec in self._registry.specs:
            iid = spec.instance_id
            state = self._registry.state(iid)
            problem = self._problems.get(iid, "")
            if state == "probing" and self._failing.get(iid):  # past the start-up grace
                state = "down"
            out.append(
                admin.status(spec, self.source_of(spec), state, self._registry.info(iid), problem)
            )
        return out

    async def _admin(self, request: WorkerAdminRequest) -> WorkerAdminReply:
        try:
            return await admin.handle(self, request)
        except admin.AdminError as exc:
            return WorkerAdminReply(status=exc.status, message=exc.message)

    # The admin API's hooks (admin.Fleet).

    def configured(self) -> dict[int, WorkerSpec]:
        return {spec.instance_id: spec for spec in self._registry.specs}

    @property
    def prefill(self) -> list[str]:
        return self._source.prefill

    async def add_worker(self, spec: WorkerSpec) -> None:
        self._added[spec.instance_id] = spec
        await self._configure(self._specs(), "admin API")
        await self._saved()

    async def remove_worker(self, instance_id: int) -> None:
        del self._added[instance_id]
        await self._configure(self._specs(), "admin API")
        await self._saved()

    async def drain_worker(self, instance_id: int, draining: bool) -> None:
        self._registry.drain(instance_id, draining)
        await self._publish()
        await self._saved()

    async def _configure(self, specs: list[WorkerSpec], what: str) -> None:
        before = self._registry.specs
        added, removed = self._registry.configure(specs)
        if before == self._registry.specs:
            return
        log.info(
            "%s changed: %d worker(s), %d added, %d removed",
            what,
            len(specs),
            len(added),
            len(removed),
        )
        for spec in removed:
            # A worker added again later starts afresh: probed at once, no backoff left over.
            tables = (
                self._failing,
                self._problems,
                self._next_probe,
                self._failures,
                self._first_probe,
            )
            for table in tables:
                table.pop(spec.instance_id, None)
        await self._prober.retain({spec.url for spec in specs})
        await self._publish()
        self._save()  # an admin entry the file took over, a drain mark of a worker gone
        if added:
            self._wake.set()  # probe the new ones now rather than at the next interval

    # ---- publishing ---------------------------------------------------------------------

    async def _publish(self) -> None:
        """Publish the difference between the routable set and the last published one."""
        if not self._probed:
            return  # nothing is known yet: the first round publishes
        routable = self._registry.routable()
        events = diff_instances(self._published, routable)
        if not events:
            return
        self._version += 1
        self._published = MappingProxyType(index_instances(routable))
        for event in events:
            _log_event(event)
        self._save()
        if self._pub is not None:
            await self._pub.send(codec.encode(FleetUpdate(self._version, events)))

    # ---- the state file -------------------------------------------------------------------

    def _restore(self, saved: Saved) -> None:
        """Drain marks, and the instance set when the file is recent (see the docstring)."""
        for iid, _url in saved.state.drained:
            self._registry.drain(iid)
        age = saved.age(time.time())
        if age is None:
            return
        if age > self._state_max_age:
            log.info(
                "state file written %.0fs ago (over %gs): probing every worker afresh",
                age,
                self._state_max_age,
            )
            return
        if not self._pods_listed():
            return  # the pods decide what is configured: wait for their list and a round
        restore = self._registry.restore
        restored = [iid for iid, url, info in saved.state.instances if restore(iid, url, info)]
        now = time.monotonic()
        for n, iid in enumerate(restored):
            batch = n % RESTORED_PROBE_BATCHES + 1
            self._next_probe[iid] = now + self._probe_interval * batch / RESTORED_PROBE_BATCHES
            self._answered.add(iid)
        self.restored = len(restored)
        self._version = max(self._version, saved.state.version + 1)
        self._probed = True
        self._published = MappingProxyType(index_instances(self._registry.routable()))
        log.info(
            "restored %d instance(s) from the state file (written %.1fs ago): serving them "
            "at once, re-probing them within %gs",
            len(restored),
            age,
            self._probe_interval,
        )

    def _save(self) -> asyncio.Future[None] | None:
        """Write the state now (queued in order); the future says when it is durable."""
        if self._keeper is None:
            return None
        return self._keeper.save(state_of(self._added, self._registry, self._version))

    async def _saved(self) -> None:
        """Write the state and wait for it: an admin change is answered once it is stored."""
        future = self._save()
        if future is not None:
            with contextlib.suppress(Exception):  # logged by the keeper; the change stands
                await future


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _log_event(event: InstanceEvent) -> None:
    if isinstance(event, InstanceRemoved):
        log.info("removed instance_id=%s url=%s", event.instance_id, event.url)
        return
    i = event.instance
    log.info(
        "%s instance_id=%s url=%s protocol=%s model=%s role=%s context_length=%s block_size=%s",
        "added" if isinstance(event, InstanceAdded) else "updated",
        i.instance_id,
        i.url,
        i.protocol,
        i.model,
        i.role,
        i.context_length,
        i.block_size,
    )
