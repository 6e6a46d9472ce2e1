"""Which pods are engines, and where: a pod object (the API's JSON, as a dict) to a WorkerSpec.

A pod is a worker only while it is Running, Ready, has an IP and is not being deleted (a
terminating pod stops getting requests at once; its streams drain during its grace period).

    gRPC port         `--k8s-grpc-port`: a number, or the name of a container port
    KV-event ports    the pod annotation switchyard.ai/kv-events-port (kv-replay-port), a number
                      or a container port name; else a container port named `kv-events`
                      (`kv-replay`); else none given and the engine's own advertisement stands
    role              label, then annotation `--k8s-role-key` (prefill | decode)
    model             label, then annotation `--k8s-model-key`: the model id clients ask for
                      (overrides the engine's served model name; annotations allow `/`)

The URL is grpc://<pod IP>:<port>, so the instance id is stable for the pod's lifetime, as for
any listed URL. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from switchyard.common.workers import ROLES, WorkerSpec

KV_EVENTS_ANNOTATION = "switchyard.ai/kv-events-port"
KV_REPLAY_ANNOTATION = "switchyard.ai/kv-replay-port"
DEFAULT_ROLE_KEY = "switchyard.ai/role"
DEFAULT_MODEL_KEY = "switchyard.ai/model"

Pod = Mapping[str, Any]


class PodProblem(ValueError):
    """A Ready pod that cannot be used as configured (logged, the pod left out)."""


@dataclass(frozen=True)
class PodRules:
    grpc_port: str = "grpc"  # a number or a container port name
    kv_events_port: str = "kv-events"  # used when no annotation says (a name: if the pod has it)
    kv_replay_port: str = "kv-replay"
    role_key: str = DEFAULT_ROLE_KEY
    model_key: str = DEFAULT_MODEL_KEY

    def __post_init__(self) -> None:
        check_port_ref("--k8s-grpc-port", self.grpc_port)
        check_port_ref("--k8s-kv-events-port", self.kv_events_port)
        check_port_ref("--k8s-kv-replay-port", self.kv_replay_port)


def check_port_ref(what: str, ref: str) -> str:
    """A port number (1-65535) or an IANA_SVC_NAME-style container port name."""
    if ref.isdigit():
        if not 0 < int(ref) < 65536:
            raise ValueError(f"{what}: port {ref} out of range")
        return ref
    if not ref or len(ref) > 15 or not ref.replace("-", "").isalnum() or ref != ref.lower():
        raise ValueError(f"{what}: {ref!r} is neither a port number nor a container port name")
    return ref


def pod_key(pod: Pod) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def is_ready(pod: Pod) -> bool:
    """Running, Ready, with an IP, and not terminating."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    if not status.get("podIP"):
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def worker_of(pod: Pod, rules: PodRules) -> WorkerSpec | None:
    """The worker a pod stands for; None when it is not Ready. Raises PodProblem when a Ready
    pod is misconfigured (no such named port, a bad role, ...)."""
    if not is_ready(pod):
        return None
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    ports = _container_ports(pod)
    host = pod["status"]["podIP"]
    if ":" in host:
        host = f"[{host}]"
    grpc_port = _resolve(rules.grpc_port, ports, "--k8s-grpc-port")
    if grpc_port is None:
        raise PodProblem(f"no container port named {rules.grpc_port!r} (--k8s-grpc-port)")
    role = labels.get(rules.role_key, annotations.get(rules.role_key))
    if role is not None and role not in ROLES:
        raise PodProblem(f"{rules.role_key}={role!r}: must be one of {', '.join(ROLES)}")
    model = labels.get(rules.model_key, annotations.get(rules.model_key)) or None
    kv_events = _endpoint(host, annotations, KV_EVENTS_ANNOTATION, rules.kv_events_port, ports)
    kv_replay = _endpoint(host, annotations, KV_REPLAY_ANNOTATION, rules.kv_replay_port, ports)
    try:
        return WorkerSpec(
            f"grpc://{host}:{grpc_port}",
            kv_events=kv_events,
            kv_replay=kv_replay,
            prefill=role == "prefill",
            model=model,
        )
    except ValueError as exc:
        raise PodProblem(str(exc)) from None


def _container_ports(pod: Pod) -> dict[str, int]:
    """Named TCP container ports of every container (names are unique within a pod)."""
    ports: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            name = port.get("name")
            if name and port.get("protocol", "TCP") == "TCP":
                ports[name] = int(port["containerPort"])
    return ports


def _resolve(ref: str, ports: Mapping[str, int], what: str) -> int | None:
    if ref.isdigit():
        return int(check_port_ref(what, ref))
    return ports.get(ref)


def _endpoint(
    host: str, annotations: Mapping[str, str], annotation: str, name: str, ports: Mapping[str, int]
) -> str | None:
    ref = annotations.get(annotation)
    if ref is not None:
        try:
            port = _resolve(check_port_ref(annotation, ref.strip()), ports, annotation)
        except ValueError as exc:
            raise PodProblem(str(exc)) from None
        if port is None:
            raise PodProblem(f"annotation {annotation}={ref!r}: no container port of that name")
    else:
        port = _resolve(name, ports, annotation)
    return None if port is None else f"tcp://{host}:{port}"
