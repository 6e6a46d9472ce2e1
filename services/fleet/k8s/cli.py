"""fleet's `--k8s-*` flags and the PodSource they describe."""

from __future__ import annotations

import argparse

from switchyard.fleet.k8s.pods import DEFAULT_MODEL_KEY, DEFAULT_ROLE_KEY, PodRules, check_port_ref
from switchyard.fleet.k8s.selector import check_key, parse_selector
from switchyard.fleet.k8s.source import PodSource


def _selector(text: str) -> str:
    try:
        parse_selector(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty selector would pick every pod of the namespace")
    return text


def _port(text: str) -> str:
    try:
        return check_port_ref("port", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _key(text: str) -> str:
    try:
        return check_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Kubernetes pods",
        "Engines as pods: every Ready pod a selector picks is a worker at grpc://<pod IP>:<port>"
        " (in-cluster service account, or a kubeconfig outside a cluster; RBAC: get, list and"
        " watch on pods).",
    )
    group.add_argument(
        "--k8s-selector",
        action="append",
        default=[],
        type=_selector,
        metavar="SELECTOR",
        help="label selector of engine pods, e.g. 'app=sglang,pool in (prefill,decode)'; "
        "repeatable: one watch each, the pods merged",
    )
    group.add_argument(
        "--k8s-namespace",
        metavar="NS",
        help="namespace of the pods (default: fleet's own in a cluster, else the kubeconfig "
        "context's, else default)",
    )
    group.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig to use (default: in-cluster config in a pod, else $KUBECONFIG or "
        "~/.kube/config)",
    )
    group.add_argument(
        "--k8s-grpc-port",
        default="grpc",
        type=_port,
        metavar="PORT",
        help="the engine's gRPC port: a number or a container port name (default grpc)",
    )
    group.add_argument(
        "--k8s-kv-events-port",
        default="kv-events",
        type=_port,
        metavar="PORT",
        help="KV-event PUB port when the pod has no switchyard.ai/kv-events-port annotation: a"
        " number or a container port name (default kv-events; a pod without it keeps the"
        " endpoint its engine advertises)",
    )
    group.add_argument(
        "--k8s-kv-replay-port",
        default="kv-replay",
        type=_port,
        metavar="PORT",
        help="KV-event replay port, likewise (annotation switchyard.ai/kv-replay-port)",
    )
    group.add_argument(
        "--k8s-role-key",
        default=DEFAULT_ROLE_KEY,
        type=_key,
        metavar="KEY",
        help=f"label (or annotation) holding prefill|decode (default {DEFAULT_ROLE_KEY})",
    )
    group.add_argument(
        "--k8s-model-key",
        default=DEFAULT_MODEL_KEY,
        type=_key,
        metavar="KEY",
        help="label (or annotation) naming the model the pod serves, overriding the engine's "
        f"served model name (default {DEFAULT_MODEL_KEY})",
    )


def pod_source(args: argparse.Namespace) -> PodSource | None:
    """None without --k8s-selector. Raises ValueError on inconsistent flags."""
    if not args.k8s_selector:
        return None
    rules = PodRules(
        grpc_port=args.k8s_grpc_port,
        kv_events_port=args.k8s_kv_events_port,
        kv_replay_port=args.k8s_kv_replay_port,
        role_key=args.k8s_role_key,
        model_key=args.k8s_model_key,
    )
    return PodSource(
        args.k8s_selector, rules, namespace=args.k8s_namespace, kubeconfig=args.kubeconfig
    )
