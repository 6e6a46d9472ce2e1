"""Fleet with a Kubernetes pod source: the test API server's pods point at mock engine
processes, and a FleetClient sees the same Added/Removed/Updated events a workers file gives.
Also `python -m switchyard.fleet` with the --k8s flags."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest
from support.k8s_api import FakeKubeApi
from support.k8s_harness import kubeconfig

from switchyard.common.fleet_client import FleetClient
from switchyard.common.workers import WorkerSpec
from switchyard.fleet.k8s.pods import PodRules
from switchyard.fleet.k8s.source import PodSource
from switchyard.fleet.service import FleetService
from switchyard.fleet.source import WorkerSource


@pytest.fixture
async def kube(tmp_path):
    api = FakeKubeApi(token="t")
    await api.start()
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig(api.url, token="t"))
    try:
        yield api, str(path)
    finally:
        await api.stop()


@contextlib.asynccontextmanager
async def fleet(config, free_port, *selectors, listed=(), rules=None):
    control, events = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    pods = PodSource(
        selectors or ("app=engine",), rules, kubeconfig=config, backoff_base=0.02, backoff_cap=0.2
    )
    service = FleetService(
        WorkerSource(list(listed)),
        control=control,
        events=events,
        probe_interval=0.2,
        probe_timeout=1.0,
        pods=pods,
    )
    changes: list = []
    client = FleetClient(control, events, on_change=changes.extend)
    try:
        await service.start()
        await client.start(timeout=10)
        yield client, changes, pods
    finally:
        await client.close()
        await service.close()


def engine_pod(api, name, engine, ready=True, labels=None, annotations=None):
    return api.create_pod(
        name,
        labels={"app": "engine", **(labels or {})},
        annotations=annotations,
        ports={"grpc": engine.port},
        ready=ready,
    )


def by_url(client):
    return {i.url: i for i in client.instances.values()}


def kinds(changes):
    return [type(e).__name__ for e in changes]


class TestPodsBecomeInstances:
    async def test_ready_unready_relabel_delete(self, kube, make_engine, free_port, until):
        api, config = kube
        sg = await make_engine("sglang", "--model-name", "sg-model")
        vl = await make_engine("vllm", "--model-name", "vl-model")
        engine_pod(api, "sg", sg)
        async with fleet(config, free_port) as (client, changes, pods):
            await until(lambda: list(by_url(client)) == [sg.url], "the Ready pod, probed")
            assert by_url(client)[sg.url].protocol == "sglang"
            engine_pod(api, "vl", vl, ready=False)
            api.set_ready("vl", True)
            await until(lambda: set(by_url(client)) == {sg.url, vl.url}, "vl once Ready")
            assert by_url(client)[vl.url].model == "vl-model"
            del changes[:]
            api.set_ready("sg", False)
            await until(lambda: set(by_url(client)) == {vl.url}, "sg unready")
            assert kinds(changes) == ["InstanceRemoved"]
            del changes[:]
            api.update_pod(
                "vl",
                lambda p: (
                    p["metadata"]
                    .setdefault("annotations", {})
                    .update({"switchyard.ai/model": "org/served-name"})
                ),
            )
            await until(lambda: by_url(client)[vl.url].model == "org/served-name", "renamed")
            assert kinds(changes) == ["InstanceUpdated"]
            api.delete_pod("vl")
            await until(lambda: not client.instances, "vl deleted")

    async def test_role_labels_make_prefill_and_decode(self, kube, make_engine, free_port, until):
        api, config = kube
        p, d = await make_engine("sglang"), await make_engine("sglang")
        engine_pod(api, "p", p, labels={"pool": "prefill", "switchyard.ai/role": "prefill"})
        engine_pod(api, "d", d, labels={"pool": "decode"})
        async with fleet(config, free_port, "pool=prefill", "pool=decode") as (client, _, _):
            await until(
                lambda: (
                    {u: i.role for u, i in by_url(client).items()}
                    == {p.url: "prefill", d.url: "decode"}
                ),
                "roles from the prefill label",
            )

    async def test_kv_event_ports_from_the_pod(self, kube, make_engine, free_port, until):
        api, config = kube
        engine = await make_engine("vllm")
        api.create_pod(
            "e",
            labels={"app": "engine"},
            annotations={"switchyard.ai/kv-replay-port": "5558"},
            ports={"grpc": engine.port, "kv-events": 5557},
            ready=True,
        )
        async with fleet(config, free_port) as (client, _, _):
            await until(lambda: client.instances, "the pod")
            (instance,) = client.instances.values()
            assert instance.kv_events_endpoint == "tcp://127.0.0.1:5557"
            assert instance.kv_replay_endpoint == "tcp://127.0.0.1:5558"

    async def test_listed_workers_and_pods_together(self, kube, make_engine, free_port, until):
        api, config = kube
        listed, pod = await make_engine("vllm"), await make_engine("sglang")
        engine_pod(api, "pod", pod)
        async with fleet(config, free_port, listed=[WorkerSpec(listed.url)]) as (client, _, _):
            await until(lambda: set(by_url(client)) == {listed.url, pod.url}, "both")
            api.set_ready("pod", False)
            await until(lambda: set(by_url(client)) == {listed.url}, "the listed one stays")


class TestApiOutage:
    async def test_instances_stay_while_the_api_server_is_down(
        self, kube, make_engine, free_port, until
    ):
        api, config = kube
        a, b = await make_engine("vllm"), await make_engine("vllm")
        engine_pod(api, "a", a)
        async with fleet(config, free_port) as (client, changes, pods):
            await until(lambda: list(by_url(client)) == [a.url], "a")
            await api.stop()
            engine_pod(api, "b", b)  # comes up during the outage
            watch = pods.watches[0]
            await until(lambda: watch._backoff.failures >= 3, "several failed reconnects")
            assert list(by_url(client)) == [a.url] and kinds(changes) == ["InstanceAdded"]
            await api.start()
            await until(lambda: set(by_url(client)) == {a.url, b.url}, "b after the outage")


async def run_fleet(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "switchyard.fleet",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, stderr.decode()


class TestCli:
    async def test_no_cluster_configuration_fails_at_start(self, tmp_path, free_port):
        code, stderr = await run_fleet(
            "--control",
            f"tcp://127.0.0.1:{free_port()}",
            "--events",
            f"tcp://127.0.0.1:{free_port()}",
            "--k8s-selector",
            "app=engine",
            "--kubeconfig",
            str(tmp_path / "none"),
        )
        assert code == 2 and "no kubeconfig" in stderr

    @pytest.mark.parametrize(
        "flags, problem",
        [
            (["--k8s-selector", "app in engine"], "parenthesized"),
            (["--k8s-selector", " "], "every pod"),
            (["--k8s-selector", "a=b", "--k8s-grpc-port", "Grpc"], "container port name"),
            (["--k8s-selector", "a=b", "--k8s-role-key=-x"], "label key"),
        ],
    )
    async def test_bad_flags_are_rejected(self, flags, problem):
        code, stderr = await run_fleet(*flags)
        assert code == 2 and problem in stderr


def test_rules_from_the_flags():
    import argparse

    from switchyard.fleet.cli import add_arguments
    from switchyard.fleet.k8s.cli import pod_source

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--k8s-selector", "a=b", "--k8s-selector", "c", "--k8s-grpc-port", "50051"]
    )
    source = pod_source(args)
    assert source is not None and source.selectors == ["a=b", "c"]
    assert source.rules == PodRules(grpc_port="50051")
    assert pod_source(parser.parse_args([])) is None
