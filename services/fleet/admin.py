"""The admin API's side in fleet: list, add, remove, drain and resume workers at run time.

Workers come from four places, merged into one configured list: `--worker` flags, the workers
file, the Ready pods (Kubernetes) and this API. Each source is authoritative for its own
entries, in that order: the API adds only URLs no other source lists (409 otherwise), removes
only what it added (409 for the others: edit the file, the flags or the pods), and an entry it
added that the file (or a pod) lists later becomes the file's. Drain and resume work on any
worker: a draining worker stays configured and probed but is not routable, so it takes no
new requests while its streams finish (the dispatchers' --drain-timeout); the mark lasts until
resumed or until the worker leaves the configuration. Every change goes through the same
configure -> probe -> publish path as a file edit, so consumers see the same instance-diff
events. The API's additions and drain marks live in fleet's memory: a restarted fleet starts
from the flags, the file and the pods again.

Pure helpers here; FleetService applies them (`_admin`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from switchyard.common.engines import EngineInfo
from switchyard.common.instance_id import InvalidEngineUrl, instance_id
from switchyard.common.workers import WorkerSpec, combine_workers, parse_worker_entry
from switchyard.protos.messages import WorkerAdminReply, WorkerAdminRequest, WorkerStatus

log = logging.getLogger(__name__)

FLAG, FILE, PODS, ADMIN = "flag", "file", "pods", "admin"


class AdminError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_entry(entry: object, prefill: Iterable[str]) -> WorkerSpec:
    """A workers-file entry from the API (a URL string with options, or a mapping), with the
    --prefill list applied. AdminError 400 when it does not parse."""
    if entry is None:
        raise AdminError(400, "give the worker as a workers-file entry: a URL or {url, ...}")
    try:
        return combine_workers([[parse_worker_entry(entry, "worker")]], prefill)[0]
    except ValueError as exc:
        raise AdminError(400, str(exc)) from None


def find(worker: str, specs: Mapping[int, WorkerSpec]) -> WorkerSpec:
    """The configured worker named by an instance id (decimal) or a URL; AdminError 404."""
    text = worker.strip()
    key: int | None = None
    if text.isdigit():
        key = int(text)
    else:
        try:
            key = instance_id(text.split("?", 1)[0])
        except (InvalidEngineUrl, ValueError):
            raise AdminError(
                400, f"{worker!r} is neither an instance id nor an engine URL"
            ) from None
    spec = specs.get(key)
    if spec is None:
        raise AdminError(404, f"no configured worker {worker!r}")
    return spec


def learned(info: EngineInfo | None) -> dict[str, str | int | bool | None] | None:
    if info is None:
        return None
    return dataclasses.asdict(info)


def status(
    spec: WorkerSpec, source: str, state: str, info: EngineInfo | None, problem: str
) -> WorkerStatus:
    return WorkerStatus(
        instance_id=spec.instance_id,
        url=spec.url,
        source=source,
        state=state,
        prefill=spec.prefill,
        model_override=spec.model,
        kv_events=spec.kv_events,
        kv_replay=spec.kv_replay,
        error=problem,
        learned=learned(info),
    )


class Fleet(Protocol):
    """What the admin API needs of FleetService."""

    @property
    def prefill(self) -> list[str]: ...

    def configured(self) -> dict[int, WorkerSpec]: ...

    def source_of(self, spec: WorkerSpec) -> str: ...

    def worker_statuses(self) -> list[WorkerStatus]: ...

    async def add_worker(self, spec: WorkerSpec) -> None: ...

    async def remove_worker(self, instance_id: int) -> None: ...

    async def drain_worker(self, instance_id: int, draining: bool) -> None: ...


def _one(fleet: Fleet, instance_id: int, status: int, message: str) -> WorkerAdminReply:
    found = [w for w in fleet.worker_statuses() if w.instance_id == instance_id]
    return WorkerAdminReply(status=status, message=message, workers=found)


async def handle(fleet: Fleet, request: WorkerAdminRequest) -> WorkerAdminReply:
    """Apply one admin request. AdminError for what cannot be done (with its status)."""
    action = request.action
    configured = fleet.configured()
    if action == "list":
        return WorkerAdminReply(status=200, workers=fleet.worker_statuses())
    if action == "add":
        spec = parse_entry(request.entry, fleet.prefill)
        if spec.instance_id in configured:
            where = fleet.source_of(configured[spec.instance_id])
            raise AdminError(409, f"{spec.url} is already configured (by the {where} list)")
        log.info("admin API: adding worker %s", spec.url)
        await fleet.add_worker(spec)
        return _one(fleet, spec.instance_id, 201, f"{spec.url} added: probing it")
    if action not in ("remove", "drain", "resume"):
        raise AdminError(400, f"unknown action {action!r}")
    spec = find(request.worker, configured)
    if action == "remove":
        source = fleet.source_of(spec)
        if source != ADMIN:
            raise AdminError(
                409,
                f"{spec.url} comes from the {source} list, which is authoritative for it: "
                "remove it there (or drain it)",
            )
        log.info("admin API: removing worker %s", spec.url)
        await fleet.remove_worker(spec.instance_id)
        return WorkerAdminReply(status=200, message=f"{spec.url} removed")
    draining = action == "drain"
    log.info("admin API: worker %s %s", spec.url, "draining" if draining else "resumed")
    await fleet.drain_worker(spec.instance_id, draining)
    return _one(fleet, spec.instance_id, 200, f"{spec.url} {'draining' if draining else 'resumed'}")
