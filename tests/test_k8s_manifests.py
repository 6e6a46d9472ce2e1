"""The Kubernetes manifests (deploy/k8s, Kustomize base + overlays), checked without a cluster.

Each overlay is rendered as `kubectl apply -k` would, by the subset of Kustomize the files use
(`resources`: files and directories; `patches`: inline JSON 6902 patches with a kind/name
target), and a kustomization using anything else fails the test instead of being rendered
wrong. Then:
- every object validates against the Kubernetes OpenAPI schemas (kubernetes-validate, strict:
  unknown fields are errors) of the oldest and newest Kubernetes versions we support;
- every pod meets Pod Security "restricted" (the rules the admission controller applies) and
  ours: read-only root with an emptyDir at /tmp, requests and limits, startup/readiness/
  liveness probes that ask the service itself, preStop + grace where streams drain;
- RBAC gives fleet get/list/watch on pods and nothing else, and nobody else a token;
- NetworkPolicies open only the API port to anyone, the admin listener and metrics ports to
  the namespace's pods and Prometheus;
- the wiring holds: commands parse with switchyard's own CLI, clients dial Services that
  select pods binding those ports, fleet's selectors pick the engine pods, named ports exist;
  the router and dispatcher Services are headless (the preprocessor dials every pod).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml
from deploy_wiring import check_wiring, parse_command, wiring_of

from switchyard.cli import build_parser
from switchyard.common.replicas import named
from switchyard.fleet.k8s.selector import parse_selector

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
IMAGE = "switchyard:local"
NAMESPACE = "switchyard"
# Native gRPC probes are GA since 1.27, the preStop `sleep` action on by default since 1.30.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}

# ---------------------------------------------------------------- rendering


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k directory` would send."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    known = {"apiVersion", "kind", "resources", "patches"}
    unknown = sorted(set(kustomization) - known)
    assert not unknown, f"{directory}: this test does not render {unknown}: extend render()"
    assert kustomization["kind"] == "Kustomization"
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects += render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for patch in kustomization.get("patches", []):
        assert set(patch) == {"target", "patch"}, f"{directory}: only inline targeted patches"
        target = patch["target"]
        assert set(target) <= {"kind", "name", "namespace"}, target
        ops = yaml.safe_load(patch["patch"])
        assert isinstance(ops, list), f"{directory}: JSON 6902 patches only"
        hits = [o for o in objects if all(_field(o, k) == v for k, v in target.items())]
        assert len(hits) == 1, f"{directory}: patch target {target} matches {len(hits)} objects"
        index = objects.index(hits[0])
        objects[index] = jsonpatch.apply_patch(hits[0], ops)
    ids = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    duplicates = {i for i in ids if ids.count(i) > 1}
    assert not duplicates, f"{directory}: objects defined twice: {duplicates}"
    return objects


def _field(obj: dict[str, Any], key: str) -> Any:
    return obj["kind"] if key == "kind" else obj["metadata"].get(key)


@pytest.fixture(scope="module", params=OVERLAYS)
def stack(request) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(K8S / "overlays" / request.param)


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def kinds(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objects:
        if o["kind"] in WORKLOADS:
            yield f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return spec.get("initContainers", []) + spec["containers"] + spec.get("ephemeralContainers", [])


def test_the_base_and_overlays_render():
    assert OVERLAYS == ["mock", "mock-pd"]
    base = render(K8S / "base")
    assert {o["kind"] for o in base} >= {"Namespace", "ServiceAccount", "Role", "Deployment"}
    assert not any(o["metadata"]["name"].startswith("engine") for o in base), "no engines"


# ---------------------------------------------------------------- schemas


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_matches_the_kubernetes_schemas(stack, version):
    name, objects = stack
    for obj in objects:
        where = f"{name}: {obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{where} (Kubernetes {version}): {path}: {exc.message}")


def test_every_namespaced_object_is_in_the_namespace(stack):
    name, objects = stack
    for obj in objects:
        expected = None if obj["kind"] in CLUSTER_SCOPED else NAMESPACE
        assert obj["metadata"].get("namespace") == expected, f"{name}: {obj['metadata']}"


# ---------------------------------------------------------------- security


def test_the_namespace_enforces_pod_security_restricted(stack):
    _, objects = stack
    (namespace,) = kinds(objects, "Namespace")
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def test_pods_meet_pod_security_restricted(stack):
    """The "restricted" profile of the Pod Security Standards, as the admission controller
    checks it (baseline rules included)."""
    name, objects = stack
    for where, pod in pod_templates(objects):
        where = f"{name}: {where}"
        spec = pod["spec"]
        pod_sc = spec.get("securityContext", {})
        for host in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(host), f"{where}: {host}"
        for volume in spec.get("volumes", []):
            kind = set(volume) - {"name"}
            assert kind <= ALLOWED_VOLUMES, f"{where}: volume {volume['name']} of type {kind}"
        assert pod_sc.get("runAsUser", 1) != 0
        for c in containers(pod):
            sc = c.get("securityContext", {})
            at = f"{where}, container {c['name']}"
            assert sc.get("privileged") is not True, f"{at}: privileged"
            assert sc.get("allowPrivilegeEscalation") is False, f"{at}: allowPrivilegeEscalation"
            caps = sc.get("capabilities", {})
            assert "ALL" in caps.get("drop", []), f"{at}: must drop ALL capabilities"
            assert set(caps.get("add", [])) <= {"NET_BIND_SERVICE"}, f"{at}: adds {caps}"
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, f"{at}: non-root"
            assert sc.get("runAsUser", pod_sc.get("runAsUser", 1)) != 0, f"{at}: runs as root"
            seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
            assert seccomp.get("type") in ("RuntimeDefault", "Localhost"), f"{at}: seccomp"
            assert not any(p.get("hostPort") for p in c.get("ports", [])), f"{at}: hostPort"


def test_root_filesystems_are_read_only_with_a_writable_tmp(stack):
    name, objects = stack
    for where, pod in pod_templates(objects):
        empty_dirs = {v["name"] for v in pod["spec"].get("volumes", []) if "emptyDir" in v}
        for c in containers(pod):
            at = f"{name}: {where}, container {c['name']}"
            assert c["securityContext"].get("readOnlyRootFilesystem") is True, at
            tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            assert tmp and tmp[0]["name"] in empty_dirs, f"{at}: an emptyDir at /tmp"


def test_every_container_has_requests_and_limits(stack):
    name, objects = stack
    for where, pod in pod_templates(objects):
        for c in containers(pod):
            resources = c.get("resources", {})
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(kind, {})), (
                    f"{name}: {where}, container {c['name']}: {kind} for cpu and memory"
                )


def test_rbac_lets_only_fleet_read_pods(stack):
    name, objects = stack
    assert not kinds(objects, "ClusterRole") and not kinds(objects, "ClusterRoleBinding")
    (role,) = kinds(objects, "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    (binding,) = kinds(objects, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fleet", "namespace": NAMESPACE}
    ]
    accounts = {a["metadata"]["name"]: a for a in kinds(objects, "ServiceAccount")}
    for where, pod in pod_templates(objects):
        spec = pod["spec"]
        account = spec.get("serviceAccountName", "default")
        assert account in accounts, f"{name}: {where} uses a ServiceAccount not defined here"
        is_fleet = containers(pod)[0]["args"][0] == "fleet"
        assert (account == "fleet") == is_fleet, f"{name}: {where}: ServiceAccount {account}"
        mounts = spec.get(
            "automountServiceAccountToken",
            accounts[account].get("automountServiceAccountToken", True),
        )
        assert mounts is is_fleet, f"{name}: {where}: only fleet mounts an API token"


# ---------------------------------------------------------------- probes, draining, metrics


def _bound_ports(parser, where, container) -> set[int]:
    args = parse_command(parser, where, container["args"])
    return {port for _, port in wiring_of(where, args).binds}


def test_probes_ask_the_service_itself(stack, parser):
    name, objects = stack
    for where, pod in pod_templates(objects):
        for c in containers(pod):
            at = f"{name}: {where}"
            args = parse_command(parser, at, c["args"])
            bound = _bound_ports(parser, at, c)
            named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(probe_name)
                assert probe, f"{at}: no {probe_name}"
                if args.command == "preprocessor":
                    path = "/ready" if probe_name == "readinessProbe" else "/health"
                    get = probe.get("httpGet", {})
                    assert get.get("path") == path, f"{at}: {probe_name} must GET {path}"
                    port = named.get(get.get("port"), get.get("port"))
                    # /ready is an operator route: on the admin listener (no token needed)
                    wanted = args.admin_port if probe_name == "readinessProbe" else args.port
                    assert port == wanted, f"{at}: {probe_name} on port {port}"
                elif args.command == "mock-engine":
                    # grpc.health.v1, which SGLang and vLLM serve in gRPC mode too.
                    assert probe.get("grpc", {}).get("port") == args.port, f"{at}: {probe_name}"
                else:
                    command = probe.get("exec", {}).get("command", [])
                    assert command[:3] == ["python", "-m", "switchyard.common.healthcheck"]
                    kind, endpoint = command[3], command[4]
                    assert kind == args.command, f"{at}: {probe_name} checks a {kind}"
                    assert int(endpoint.rsplit(":", 1)[1]) in bound, f"{at}: {endpoint}"
                    assert probe.get("timeoutSeconds", 1) > 3, "above the check's 3 s timeout"


def test_streams_drain_before_a_pod_goes(stack, parser):
    """Pods holding client or engine streams: a preStop pause (the pod leaves the Service,
    its DNS answer or fleet's set first) and a grace period that covers it plus the streams'
    end."""
    name, objects = stack
    for where, pod in pod_templates(objects):
        (c,) = pod["spec"]["containers"]
        command = parse_command(parser, where, c["args"]).command
        if command not in ("preprocessor", "dispatcher", "mock-engine"):
            continue
        pause = c["lifecycle"]["preStop"]["sleep"]["seconds"]
        grace = pod["spec"]["terminationGracePeriodSeconds"]
        assert 0 < pause and grace >= pause + 30, f"{name}: {where}: preStop {pause}, grace {grace}"
        if command == "preprocessor":  # its own grace (+5 s backstop) fits in the pod's
            own = parse_command(parser, where, c["args"]).shutdown_grace
            assert pause + own + 5 < grace, f"{name}: {where}: --shutdown-grace {own}"
        if command == "dispatcher":  # the streams' grace fits in the pod's
            own = parse_command(parser, where, c["args"]).shutdown_grace
            assert pause + own < grace, f"{name}: {where}: --shutdown-grace {own}"


def test_prometheus_scrapes_every_service(stack, parser):
    name, objects = stack
    for where, pod in pod_templates(objects):
        (c,) = pod["spec"]["containers"]
        args = parse_command(parser, where, c["args"])
        if args.command == "mock-engine":
            continue  # the mock has no metrics; real engines serve their own
        annotations = pod["metadata"].get("annotations", {})
        at = f"{name}: {where}"
        assert annotations.get("prometheus.io/scrape") == "true", f"{at}: not scraped"
        assert annotations.get("prometheus.io/path") == "/metrics"
        port = int(annotations["prometheus.io/port"])
        assert port in {p["containerPort"] for p in c["ports"]}, f"{at}: {port} not declared"
        if args.command == "preprocessor":
            assert port == args.admin_port, f"{at}: /metrics is on the admin listener"
            assert args.admin_host == "0.0.0.0", f"{at}: the admin listener must be reachable"
        else:
            assert (args.metrics_host, args.metrics_port) == ("0.0.0.0", port), at


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"this test reads matchLabels only: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _is_prometheus(source: dict[str, Any]) -> bool:
    pods = source.get("podSelector", {}).get("matchLabels")
    return pods == {"app.kubernetes.io/name": "prometheus"}


def test_network_policies_fence_off_the_admin_listener(stack, parser):
    """Every Switchyard pod is selected by an ingress NetworkPolicy (so what no rule allows is
    refused); the one port open to any source is the preprocessor's API port; the admin
    listener (tokenless) and the metrics ports are reachable from this namespace's pods and
    Prometheus only, and Prometheus reaches every port it scrapes."""
    name, objects = stack
    policies = kinds(objects, "NetworkPolicy")
    for where, pod in pod_templates(objects):
        labels = pod["metadata"]["labels"]
        if labels.get("app.kubernetes.io/name") != "switchyard":
            continue
        at = f"{name}: {where}"
        mine = [p for p in policies if _selects(p["spec"]["podSelector"], labels)]
        assert mine, f"{at}: no NetworkPolicy selects it"
        assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in mine), at
        (c,) = pod["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        open_to_all: set[int] = set()
        prometheus: set[int] = set()
        for policy in mine:
            for rule in policy["spec"].get("ingress", []):
                given = {ports.get(p["port"], p["port"]) for p in rule.get("ports", [])}
                reached = given & set(ports.values()) if given else set(ports.values())
                sources = rule.get("from")
                if not sources:
                    open_to_all |= reached
                elif all(_is_prometheus(s) for s in sources):
                    prometheus |= reached
                else:  # this namespace's pods (no namespaceSelector, no ipBlock)
                    assert sources == [{"podSelector": {}}], f"{at}: {policy['metadata']['name']}"
        args = parse_command(parser, where, c["args"])
        assert open_to_all == ({args.port} if args.command == "preprocessor" else set()), at
        scraped = pod["metadata"].get("annotations", {}).get("prometheus.io/port")
        if scraped is not None:
            assert int(scraped) in prometheus, f"{at}: Prometheus cannot reach port {scraped}"


def test_disruption_budgets_cover_the_scaled_pods(stack):
    name, objects = stack
    budgets = kinds(objects, "PodDisruptionBudget")
    for workload in kinds(objects, "Deployment"):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covering = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        at = f"{name}: Deployment/{workload['metadata']['name']}"
        if (
            workload["spec"]["replicas"] > 1
            or labels.get("app.kubernetes.io/component") == "engine"
        ):
            assert len(covering) == 1, f"{at}: {len(covering)} PodDisruptionBudgets"
    for budget in budgets:
        selector = budget["spec"]["selector"]["matchLabels"]
        assert any(
            selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
            for w in kinds(objects, "Deployment")
        ), f"{name}: PDB {budget['metadata']['name']} selects no pods"


# ---------------------------------------------------------------- wiring


def test_services_select_pods_that_bind_their_ports(stack, parser):
    name, objects = stack
    deployments = kinds(objects, "Deployment")
    commands: dict[str, argparse.Namespace] = {}
    for service in kinds(objects, "Service"):
        svc = service["metadata"]["name"]
        selector = service["spec"]["selector"]
        matches = [
            d
            for d in deployments
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matches) == 1, f"{name}: Service {svc} selects {len(matches)} Deployments"
        (c,) = matches[0]["spec"]["template"]["spec"]["containers"]
        commands[svc] = parse_command(parser, f"{name}/{svc}", c["args"])
        named = {p["name"]: p["containerPort"] for p in c["ports"]}
        bound = _bound_ports(parser, f"{name}/{svc}", c)
        for port in service["spec"]["ports"]:
            target = named.get(port["targetPort"], port["targetPort"])
            assert port["port"] == target and target in bound, (
                f"{name}: Service {svc} port {port} is not one its pods bind {sorted(bound)}"
            )
    assert {a.command for a in commands.values()} == {
        "fleet",
        "router",
        "dispatcher",
        "preprocessor",
    }
    check_wiring(name, commands)


def test_the_router_and_dispatcher_names_resolve_to_every_pod(stack, parser):
    """The preprocessor connects to every address its --router and --dispatcher names resolve
    to (common.replicas): their Services are headless, so DNS answers with each ready pod. A
    ClusterIP is one virtual address: one connection, to one pod, whatever `replicas` says."""
    name, objects = stack
    services = {s["metadata"]["name"]: s for s in kinds(objects, "Service")}
    for where, pod in pod_templates(objects):
        (c,) = pod["spec"]["containers"]
        args = parse_command(parser, where, c["args"])
        if args.command != "preprocessor":
            continue
        for endpoint in args.router + args.dispatcher:
            host = named(endpoint)
            assert host is not None, f"{name}: {where}: {endpoint} names no Service"
            service = services[host[0].split(".")[0]]
            assert service["spec"].get("clusterIP") == "None", (
                f"{name}: Service {host[0]} is not headless"
            )


def test_every_container_runs_the_one_image(stack):
    name, objects = stack
    for where, pod in pod_templates(objects):
        for c in containers(pod):
            assert c["image"] == IMAGE, f"{name}: {where}: {c['image']}"
            assert "command" not in c, f"{name}: {where}: keep the image's switchyard entrypoint"


def test_fleet_selectors_pick_the_engine_pods(stack, parser):
    name, objects = stack
    (fleet,) = [d for d in kinds(objects, "Deployment") if d["metadata"]["name"] == "fleet"]
    assert fleet["spec"]["replicas"] == 1 and fleet["spec"]["strategy"]["type"] == "Recreate"
    args = parse_command(
        parser, "fleet", fleet["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert args.k8s_selector and not args.worker and args.k8s_namespace is None
    selectors = [parse_selector(text) for text in args.k8s_selector]
    engines, others = [], []
    for where, pod in pod_templates(objects):
        command = parse_command(parser, where, pod["spec"]["containers"][0]["args"]).command
        (engines if command == "mock-engine" else others).append((where, pod))
    assert engines, f"{name}: no engine pods"
    for selector in selectors:
        picked = [w for w, pod in engines if selector.matches(pod["metadata"]["labels"])]
        assert picked, f"{name}: --k8s-selector {selector.text!r} picks no engine pods"
    for where, pod in others:
        assert not any(s.matches(pod["metadata"]["labels"]) for s in selectors), (
            f"{name}: fleet's selectors pick {where}, which is no engine"
        )
    for where, pod in engines:
        (c,) = pod["spec"]["containers"]
        engine = parse_command(parser, where, c["args"])
        named = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert named.get(args.k8s_grpc_port) == engine.port, (
            f"{where}: no port {args.k8s_grpc_port}"
        )
        # The engine binds its KV-event sockets on every interface; the ports fleet reads
        # are the ones the engine was told to bind.
        for flag, port_name in (
            (engine.kv_events_endpoint, args.k8s_kv_events_port),
            (engine.kv_replay_endpoint, args.k8s_kv_replay_port),
        ):
            assert flag and flag.startswith("tcp://*:"), f"{where}: KV sockets bind tcp://*:P"
            assert named.get(port_name) == int(flag.rsplit(":", 1)[1]), f"{where}: {port_name}"
        role = pod["metadata"]["labels"].get(args.k8s_role_key)
        if engine.role in ("prefill", "decode"):
            assert role == engine.role, f"{where}: label {args.k8s_role_key} says {role}"


# ---------------------------------------------------------------- monitoring and autoscaling

MONITORING = K8S / "monitoring"
SERVICE_MONITOR_SCHEMA = K8S / "schemas" / "servicemonitor-v1-prometheus-operator-0.93.0.json"


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused (the API server prunes them silently, so
    a misspelt field would do nothing): every object with properties gets
    additionalProperties false, unless it keeps unknown fields on purpose."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def monitoring() -> list[dict[str, Any]]:
    return render(MONITORING)


def test_the_monitoring_manifests_match_their_schemas(monitoring):
    import json

    import jsonschema

    kinds_found = sorted(o["kind"] for o in monitoring)
    assert kinds_found == [
        "HorizontalPodAutoscaler", "HorizontalPodAutoscaler", "Service", "ServiceMonitor"
    ]  # fmt: skip
    schema = json.loads(SERVICE_MONITOR_SCHEMA.read_text())
    assert "prometheus-operator v0.93.0" in schema["$comment"]  # where it came from
    validator = jsonschema.Draft7Validator(_strict(schema))
    for obj in monitoring:
        assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]
        if obj["kind"] == "ServiceMonitor":
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(obj)]
            assert not errors, errors
            broken = copy.deepcopy(obj)
            broken["spec"]["endpoints"][0]["intervall"] = "15s"
            assert not validator.is_valid(broken)  # the strict schema catches a typo
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)


def test_the_service_monitor_reaches_every_services_metrics(monitoring, stack, parser):
    """The ServiceMonitor selects the metrics Service; that Service selects every Switchyard
    pod of the base, and each of fleet, router, dispatcher and preprocessor has a container
    port the Service names, on which it serves /metrics."""
    _, objects = stack
    (service,) = kinds(monitoring, "Service")
    (monitor,) = kinds(monitoring, "ServiceMonitor")
    assert _selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    scraped = {e["port"] for e in monitor["spec"]["endpoints"]}
    assert scraped == {p["name"] for p in service["spec"]["ports"]}
    named = {p["targetPort"] for p in service["spec"]["ports"]}
    covered = set()
    for _name, pod in pod_templates(objects):
        labels = pod["metadata"]["labels"]
        if not _selects({"matchLabels": service["spec"]["selector"]}, labels):
            continue
        ports = {p["name"] for c in containers(pod) for p in c.get("ports", [])}
        if ports & named:
            covered.add(labels["app.kubernetes.io/component"])
    assert {"fleet", "router", "dispatcher", "preprocessor"} <= covered, covered


def test_the_autoscalers_scale_deployments_with_cpu_requests(monitoring, stack):
    _, objects = stack
    deployments = {d["metadata"]["name"]: d for d in kinds(objects, "Deployment")}
    for hpa in kinds(monitoring, "HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and target["name"] in deployments, target
        pod = deployments[target["name"]]["spec"]["template"]
        for container in containers(pod):
            assert "cpu" in container["resources"]["requests"], target  # utilization's base
        assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
