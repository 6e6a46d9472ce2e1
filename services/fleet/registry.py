"""Fleet's state: the configured workers, the last probe result of each, down and drain marks.

Pure (no I/O, no clock): the service feeds it specs, probe results and down reports, and
reads back the routable list, which it diffs against what it last published.

Role resolution: the engine's own role wins. When the engine reports none, the operator's
prefill list decides: a listed worker is prefill; the others are decode when any configured
worker is listed as prefill, aggregated otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from switchyard.common.engines import EngineInfo
from switchyard.common.kv_endpoints import listen_endpoint
from switchyard.common.workers import WorkerSpec
from switchyard.protos.messages import ROLE_AGGREGATED, ROLE_DECODE, ROLE_PREFILL, Instance

_WILDCARD_HOSTS = ("*", "0.0.0.0", "[::]", "::")


def resolve_role(engine_role: str | None, listed_prefill: bool, any_listed_prefill: bool) -> str:
    if engine_role:
        return engine_role
    if listed_prefill:
        return ROLE_PREFILL
    return ROLE_DECODE if any_listed_prefill else ROLE_AGGREGATED


def connectable_endpoint(endpoint: str | None, engine_url: str) -> str | None:
    """Engines advertise the address they bind (`tcp://*:5557`); consumers need one they can
    connect to, so a wildcard host becomes the engine's own host."""
    if not endpoint or not endpoint.startswith("tcp://"):
        return endpoint
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    if sep and host in _WILDCARD_HOSTS:
        engine_host = urlsplit(engine_url).hostname or "127.0.0.1"
        if ":" in engine_host:
            engine_host = f"[{engine_host}]"
        return f"tcp://{engine_host}:{port}"
    return endpoint


def kv_sources(spec: WorkerSpec, info: EngineInfo) -> tuple[str | None, str | None]:
    """(the engine's bound PUB to connect to, the endpoint to bind for its connecting PUB):
    the operator's option wins, else the engine's report by the engine's own rule."""
    if spec.kv_events or spec.kv_bind:
        return spec.kv_events, spec.kv_bind
    endpoint = info.kv_events_endpoint
    if not endpoint:
        return None, None
    if info.kv_events_binds:
        return connectable_endpoint(endpoint, spec.url), None
    return None, listen_endpoint(endpoint)


def build_instance(
    spec: WorkerSpec, info: EngineInfo, any_listed_prefill: bool, admitted_at: float = 0.0
) -> Instance:
    """The routable record of a worker; endpoints from the spec override the engine's."""
    events, bind = kv_sources(spec, info)
    return Instance(
        instance_id=spec.instance_id,
        url=spec.url,
        protocol=info.protocol,
        model=spec.model or info.model,
        context_length=info.context_length,
        block_size=info.block_size,
        role=resolve_role(info.role, spec.prefill, any_listed_prefill),
        bootstrap_port=info.bootstrap_port,
        kv_events_endpoint=events,
        kv_replay_endpoint=spec.kv_replay
        or connectable_endpoint(info.kv_replay_endpoint, spec.url),
        kv_events_bind=bind,
        kv_topic=spec.kv_topic if spec.kv_topic is not None else info.kv_topic,
        admitted_at=admitted_at,
        max_running_requests=info.max_running_requests,
        local_prefill=info.local_prefill,
        is_generation=info.is_generation,
        dp_size=info.dp_size,
    )


class Registry:
    """Probe rounds are numbered; a down mark set while round N was the latest is cleared
    only by a successful probe from a round started after it (so a probe already in flight
    when the report came cannot undo it).

    A probe that fails outright (connection refused or reset, the engine says it is
    unhealthy, a malformed answer) takes a routable instance out at once. A probe that got
    no answer in time is ambiguous (a dead host, or a live engine on a loaded machine): a
    routable instance stays routable until `down_after` of those in a row."""

    def __init__(
        self, specs: Iterable[WorkerSpec] = (), readmit_after: int = 2, down_after: int = 3
    ) -> None:
        if readmit_after < 1:
            raise ValueError(f"readmit_after must be >= 1, got {readmit_after}")
        if down_after < 1:
            raise ValueError(f"down_after must be >= 1, got {down_after}")
        self.readmit_after = readmit_after
        self.down_after = down_after
        # Routable instances whose last probes timed out: how many in a row so far.
        self._timeouts: dict[int, int] = {}
        self._specs: dict[int, WorkerSpec] = {}
        self._info: dict[int, EngineInfo] = {}
        self._down: dict[int, int] = {}  # instance id -> latest round when it was reported
        # Instances that were down and answer again: consecutive good probes so far. They are
        # re-admitted after `readmit_after` of them (a flapping engine stays out).
        self._streak: dict[int, int] = {}
        # Drained by the operator (admin API): probed as usual, never routable, until resumed
        # or no longer configured.
        self._draining: set[int] = set()
        self._admitted: dict[int, float] = {}  # instance id -> wall clock of its admission
        self._round = 0
        self.configure(specs)

    @property
    def specs(self) -> list[WorkerSpec]:
        return sorted(self._specs.values(), key=lambda spec: spec.url)

    def configure(self, specs: Iterable[WorkerSpec]) -> tuple[list[WorkerSpec], list[WorkerSpec]]:
        """Replace the configured list; returns (added, removed). A spec whose options
        changed keeps its probe result and down mark."""
        new = {spec.instance_id: spec for spec in specs}
        added = [spec for i, spec in new.items() if i not in self._specs]
        removed = [spec for i, spec in self._specs.items() if i not in new]
        for spec in removed:
            self._info.pop(spec.instance_id, None)
            self._down.pop(spec.instance_id, None)
            self._streak.pop(spec.instance_id, None)
            self._timeouts.pop(spec.instance_id, None)
            self._draining.discard(spec.instance_id)
            self._admitted.pop(spec.instance_id, None)
        self._specs = new
        return added, removed

    def has(self, instance_id: int) -> bool:
        return instance_id in self._specs

    def spec(self, instance_id: int) -> WorkerSpec | None:
        return self._specs.get(instance_id)

    def info(self, instance_id: int) -> EngineInfo | None:
        """What the last good probe learned (None: no good probe since it was down)."""
        return self._info.get(instance_id)

    def drain(self, instance_id: int, draining: bool = True) -> bool:
        """Mark (or unmark) a worker as draining; False when it is not configured."""
        if instance_id not in self._specs:
            return False
        if draining:
            self._draining.add(instance_id)
        else:
            self._draining.discard(instance_id)
        return True

    def state(self, instance_id: int) -> str:
        """probing (no good probe yet, or being re-admitted), ready (routable), draining
        (the operator's mark), down (reported down, or answering no probe)."""
        if instance_id in self._draining:
            return "draining"
        if instance_id in self._down:
            return "down"
        if instance_id in self._info:
            return "probing" if instance_id in self._streak else "ready"
        return "down" if instance_id in self._streak else "probing"

    def start_round(self) -> int:
        self._round += 1
        return self._round

    def _admissible(self, instance_id: int) -> bool:
        return (
            instance_id in self._info
            and instance_id not in self._down
            and instance_id not in self._streak
        )

    def record(
        self,
        instance_id: int,
        round_: int,
        info: EngineInfo | None,
        now: float = 0.0,
        timed_out: bool = False,
    ) -> None:
        """A probe result from `round_`: its info, or None when the probe failed (`timed_out`:
        it got no answer in time). `now` (wall clock) stamps an admission: the probe that
        makes the instance routable again."""
        if instance_id not in self._specs:
            return  # removed while the probe was in flight
        was = self._admissible(instance_id)
        if info is None and timed_out and was:
            timeouts = self._timeouts.get(instance_id, 0) + 1
            if timeouts < self.down_after:
                self._timeouts[instance_id] = timeouts  # still routable, on its last info
                return
        self._timeouts.pop(instance_id, None)
        self._record(instance_id, round_, info)
        if not was and self._admissible(instance_id):
            self._admitted[instance_id] = now

    def timeouts(self, instance_id: int) -> int:
        """Probes of a routable instance that timed out in a row (below `down_after`)."""
        return self._timeouts.get(instance_id, 0)

    def _record(self, instance_id: int, round_: int, info: EngineInfo | None) -> None:
        if info is None:
            if self._info.pop(instance_id, None) is not None or instance_id in self._streak:
                self._streak[instance_id] = 0  # it was up (or recovering): start over
            return
        self._info[instance_id] = info
        if self._down.get(instance_id, round_) < round_:
            del self._down[instance_id]
            self._streak.setdefault(instance_id, 0)
        if instance_id in self._streak and instance_id not in self._down:
            self._streak[instance_id] += 1
            if self._streak[instance_id] >= self.readmit_after:
                del self._streak[instance_id]

    def mark_down(self, instance_id: int) -> bool:
        """Take an instance out of the routable set until a later probe succeeds. False when
        the id is not configured."""
        if instance_id not in self._specs:
            return False
        self._down[instance_id] = self._round
        return True

    def is_down(self, instance_id: int) -> bool:
        return instance_id in self._down

    def draining(self) -> set[int]:
        return set(self._draining)

    def known(self) -> dict[int, EngineInfo]:
        """What the last good probe learned of each worker that is routable or draining (not
        down, not being re-admitted): what a restarted fleet may restore."""
        return {
            iid: info
            for iid, info in self._info.items()
            if iid not in self._down and iid not in self._streak
        }

    def restore(self, instance_id: int, url: str, info: EngineInfo) -> bool:
        """Take a stored probe result as this worker's last one (routable at once unless
        drained). False when no configured worker has that id and URL."""
        spec = self._specs.get(instance_id)
        if spec is None or spec.url != url:
            return False
        self._info[instance_id] = info
        return True

    def states(self) -> list[tuple[str, str]]:
        """(role, state) of every configured worker; state is routable, down (reported or
        not answering), recovering (answering, not yet re-admitted) or unprobed."""
        routable = {i.instance_id: i.role for i in self.routable()}
        out = []
        for spec in self.specs:
            iid = spec.instance_id
            if iid in routable:
                out.append((routable[iid], "routable"))
            elif iid in self._streak and iid in self._info:
                out.append(("unknown", "recovering"))
            elif iid in self._draining:
                out.append(("unknown", "draining"))
            elif iid in self._down or iid in self._streak:
                out.append(("unknown", "down"))
            else:
                out.append(("unknown", "unprobed"))
        return out

    def worker_states(self) -> list[tuple[str, str, str]]:
        """(url, model, state) of every configured worker (states as in `states`; model as
        the engine last reported it, "" before a probe answered)."""
        states = self.states()
        out = []
        for spec, (_, state) in zip(self.specs, states, strict=True):
            info = self._info.get(spec.instance_id)
            model = spec.model or (info.model if info is not None else "")
            out.append((spec.url, model, state))
        return out

    def recovering(self) -> bool:
        """Some instance is down or being re-admitted (probe it soon, not in a full cycle)."""
        return bool(self._down or self._streak)

    def routable(self) -> list[Instance]:
        any_listed_prefill = any(spec.prefill for spec in self._specs.values())
        return [
            build_instance(
                spec,
                self._info[spec.instance_id],
                any_listed_prefill,
                self._admitted.get(spec.instance_id, 0.0),
            )
            for spec in self.specs
            if spec.instance_id in self._info
            and spec.instance_id not in self._down
            and spec.instance_id not in self._streak
            and spec.instance_id not in self._draining
        ]
