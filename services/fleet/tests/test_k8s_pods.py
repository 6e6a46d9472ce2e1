import copy

import pytest

from switchyard.fleet.k8s.pods import PodProblem, PodRules, is_ready, worker_of


def pod(ip="10.1.2.3", ports=None, labels=None, annotations=None, ready=True, **status):
    """A Running pod as the API returns it (list items have no kind/apiVersion)."""
    return {
        "metadata": {
            "name": "engine-0",
            "namespace": "llm",
            "uid": "u-1",
            "resourceVersion": "7",
            "labels": labels or {"app": "engine"},
            **({"annotations": annotations} if annotations else {}),
        },
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "ports": [
                        {"name": n, "containerPort": p, "protocol": "TCP"}
                        for n, p in (ports if ports is not None else {"grpc": 30000}).items()
                    ],
                },
                {"name": "sidecar"},  # no ports at all
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
            **status,
        },
    }


class TestReadiness:
    def test_running_ready_with_ip(self):
        assert is_ready(pod())

    @pytest.mark.parametrize(
        "change",
        [
            lambda p: p["status"].update(phase="Pending"),
            lambda p: p["status"].update(phase="Succeeded"),
            lambda p: p["status"].pop("podIP"),
            lambda p: p["status"]["conditions"].pop(),  # no Ready condition
            lambda p: p["status"]["conditions"][1].update(status="False"),
            lambda p: p["status"]["conditions"][1].update(status="Unknown"),
            lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"),
        ],
        ids=["pending", "succeeded", "no-ip", "no-ready", "unready", "unknown", "terminating"],
    )
    def test_anything_else_is_not_a_worker(self, change):
        p = copy.deepcopy(pod())
        change(p)
        assert not is_ready(p)
        assert worker_of(p, PodRules()) is None

    def test_bookmark_shaped_objects_are_not_workers(self):
        bookmark = {"metadata": {"resourceVersion": "9"}, "spec": {"containers": None}}
        assert worker_of(bookmark, PodRules()) is None


class TestPorts:
    def test_named_grpc_port(self):
        spec = worker_of(pod(ports={"grpc": 30000, "metrics": 9090}), PodRules())
        assert spec is not None and spec.url == "grpc://10.1.2.3:30000"
        assert (spec.kv_events, spec.kv_replay, spec.prefill, spec.model) == (
            None,
            None,
            False,
            None,
        )

    def test_numbered_grpc_port_needs_no_declared_port(self):
        spec = worker_of(pod(ports={}), PodRules(grpc_port="50051"))
        assert spec is not None and spec.url == "grpc://10.1.2.3:50051"

    def test_missing_named_port_is_a_problem(self):
        with pytest.raises(PodProblem, match="no container port named 'engine-grpc'"):
            worker_of(pod(), PodRules(grpc_port="engine-grpc"))

    def test_kv_ports_from_named_ports(self):
        spec = worker_of(pod(ports={"grpc": 1, "kv-events": 5557, "kv-replay": 5558}), PodRules())
        assert spec is not None
        assert (spec.kv_events, spec.kv_replay) == ("tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558")

    def test_kv_ports_from_annotations_win(self):
        annotations = {
            "switchyard.ai/kv-events-port": "6000",
            "switchyard.ai/kv-replay-port": "replay",
        }
        spec = worker_of(
            pod(ports={"grpc": 1, "kv-events": 5557, "replay": 6001}, annotations=annotations),
            PodRules(),
        )
        assert spec is not None
        assert (spec.kv_events, spec.kv_replay) == ("tcp://10.1.2.3:6000", "tcp://10.1.2.3:6001")

    @pytest.mark.parametrize("value", ["nope", "70000", "0", ""])
    def test_bad_annotation_is_a_problem(self, value):
        with pytest.raises(PodProblem, match="kv-events-port"):
            worker_of(pod(annotations={"switchyard.ai/kv-events-port": value}), PodRules())

    def test_renamed_kv_port_names(self):
        rules = PodRules(kv_events_port="zmq-pub", kv_replay_port="5558")
        spec = worker_of(pod(ports={"grpc": 1, "zmq-pub": 7000}), rules)
        assert spec is not None
        assert (spec.kv_events, spec.kv_replay) == ("tcp://10.1.2.3:7000", "tcp://10.1.2.3:5558")

    def test_udp_ports_do_not_count(self):
        p = pod(ports={})
        p["spec"]["containers"][0]["ports"] = [
            {"name": "grpc", "containerPort": 30000, "protocol": "UDP"}
        ]
        with pytest.raises(PodProblem):
            worker_of(p, PodRules())

    def test_ipv6_pod(self):
        spec = worker_of(pod(ip="fd00::12", ports={"grpc": 30000, "kv-events": 5557}), PodRules())
        assert spec is not None
        assert spec.url == "grpc://[fd00::12]:30000"
        assert spec.kv_events == "tcp://[fd00::12]:5557"

    @pytest.mark.parametrize("bad", ["0", "65536", "Grpc", "a_b", "x" * 16, ""])
    def test_rules_reject_bad_port_refs(self, bad):
        with pytest.raises(ValueError):
            PodRules(grpc_port=bad)


class TestRoleAndModel:
    def test_role_from_label(self):
        spec = worker_of(pod(labels={"switchyard.ai/role": "prefill"}), PodRules())
        assert spec is not None and spec.prefill

    def test_role_from_annotation_and_custom_key(self):
        rules = PodRules(role_key="llm-d.ai/role")
        spec = worker_of(pod(annotations={"llm-d.ai/role": "decode"}), rules)
        assert spec is not None and not spec.prefill

    def test_label_wins_over_annotation(self):
        p = pod(
            labels={"switchyard.ai/role": "decode"},
            annotations={"switchyard.ai/role": "prefill"},
        )
        spec = worker_of(p, PodRules())
        assert spec is not None and not spec.prefill

    def test_bad_role_is_a_problem(self):
        with pytest.raises(PodProblem, match="must be one of prefill, decode"):
            worker_of(pod(labels={"switchyard.ai/role": "both"}), PodRules())

    def test_model_from_label_or_annotation(self):
        spec = worker_of(pod(labels={"switchyard.ai/model": "llama-3-8b"}), PodRules())
        assert spec is not None and spec.model == "llama-3-8b"
        # Label values cannot hold a `/`; annotations can.
        p = pod(annotations={"switchyard.ai/model": "meta-llama/Llama-3.1-8B-Instruct"})
        spec = worker_of(p, PodRules())
        assert spec is not None and spec.model == "meta-llama/Llama-3.1-8B-Instruct"

    def test_same_pod_same_instance_id(self):
        first, second = worker_of(pod(), PodRules()), worker_of(pod(), PodRules())
        assert first is not None and second is not None
        assert first.instance_id == second.instance_id
