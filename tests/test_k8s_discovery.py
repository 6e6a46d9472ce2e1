"""End to end with Kubernetes pod discovery: fleet reads its engines from a test API server
(the real list/watch wire, through the real client library), the rest of the stack as usual.

A pod that appears mid-run gets requests once it is Ready; the API server goes away for a
while and nothing changes; a pod that goes unready stops getting them, and its engine can
then exit, with no request failing: a streaming client runs the whole time, and no process of
the stack restarts. (Pods point at mock engines on loopback; pod IPs are 127.0.0.1, ports differ.)
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
from e2e_stack import Processes, wait_until
from support.k8s_harness import ThreadedFakeKubeApi, kubeconfig

from switchyard.common.instance_id import instance_id

MODEL = "deepseek-mock"
NAMESPACE = "llm"
TOKEN = "fleet-sa-token"


def argv() -> list[str]:
    """A mock engine binding its own ports (port 0), reported in its ready file."""
    return [
        "mock-engine",
        "--protocol",
        "vllm",
        "--port",
        "0",
        "--itl-ms",
        "10",
        "--kv-events-endpoint",
        "tcp://127.0.0.1:0",
        "--kv-replay-endpoint",
        "tcp://127.0.0.1:0",
    ]


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


@dataclass
class Engine:
    name: str
    port: int
    pub: int
    replay: int

    @classmethod
    def started(cls, procs: Processes, name: str) -> Engine:
        bound = procs.serve(f"engine-{name}", *argv())
        return cls(name, bound["port"], port_of(bound["kv_events"]), port_of(bound["kv_replay"]))

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    @property
    def instance_id(self) -> int:
        return instance_id(self.url)

    def pod(self, kube: ThreadedFakeKubeApi) -> None:
        """The engine's pod, Pending: the KV-event ports come from its annotations."""
        kube.call(
            kube.api.create_pod,
            self.name,
            namespace=NAMESPACE,
            labels={"app.kubernetes.io/name": "engine", "pool": "main"},
            annotations={
                "switchyard.ai/kv-events-port": str(self.pub),
                "switchyard.ai/kv-replay-port": str(self.replay),
            },
            ports={"grpc": self.port},
        )


@dataclass
class Traffic:
    """Streaming chat requests one after another until stopped; every failure is kept."""

    base: str
    done: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                try:
                    stream = client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"{n}: background traffic"}],
                        max_tokens=12,
                        stream=True,
                        timeout=60,
                    )
                    finish = [c.choices[0].finish_reason for c in stream if c.choices]
                    if finish[-1] not in ("stop", "length"):
                        self.failures.append(f"request {n}: finish {finish[-1]}")
                except openai.OpenAIError as exc:
                    self.failures.append(f"request {n}: {exc!r}")
                self.done += 1

    @contextlib.contextmanager
    def running(self):
        thread = threading.Thread(target=self.run, name="traffic", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=90)
            assert not thread.is_alive(), "the traffic thread hung"


def route(base: str, body: dict) -> dict:
    reply = httpx.post(base + "/debug/route", json=body, timeout=10)
    reply.raise_for_status()
    return reply.json()


def routable(base: str) -> set[int]:
    try:
        workers = route(base, {"model": MODEL, "prompt": "x"})["workers"]
    except httpx.HTTPError:
        return set()
    return {w["instance_id"] for w in workers}


def holder(base: str, body: dict, *engines: Engine) -> str | None:
    """The engine whose KV cache holds this request's prompt, as the router knows it."""
    overlaps = {w["instance_id"]: w["overlap_blocks"] for w in route(base, body)["workers"]}
    return next((e.name for e in engines if overlaps.get(e.instance_id, 0) > 0), None)


def test_pods_joining_and_leaving_mid_run(tmp_path: Path):
    kube = ThreadedFakeKubeApi(token=TOKEN, bookmark_interval=1.0)
    try:
        kube.call(kube.api.start)
        config = tmp_path / "kubeconfig"
        config.write_text(kubeconfig(kube.api.url, token=TOKEN, namespace=NAMESPACE))
        with Processes() as procs:
            a, b = (Engine.started(procs, name) for name in ("a", "b"))
            # Only fleet knows about Kubernetes: the other services are started as always.
            fleet = procs.serve(
                "fleet",
                "fleet",
                "--control",
                "tcp://127.0.0.1:0",
                "--events",
                "tcp://127.0.0.1:0",
                "--probe-interval",
                "0.5",
                "--kubeconfig",
                str(config),
                "--k8s-selector",
                "app.kubernetes.io/name=engine,pool in (main)",
            )
            fleet_flags = ["--fleet-control", fleet["control"], "--fleet-events", fleet["events"]]
            router = procs.serve("router", "router", "--bind", "tcp://127.0.0.1:0", *fleet_flags)
            dispatcher = procs.serve(
                "dispatcher", "dispatcher", "--bind", "tcp://127.0.0.1:0", *fleet_flags
            )
            pre = procs.serve(
                "preprocessor",
                "preprocessor",
                "--port",
                "0",
                "--router",
                router["bind"],
                "--dispatcher",
                dispatcher["bind"],
                *fleet_flags,
            )
            base = f"http://127.0.0.1:{pre['port']}"
            try:
                a.pod(kube)
                kube.call(kube.api.set_ready, "a", True, namespace=NAMESPACE)
                wait_until(lambda: routable(base) == {a.instance_id}, 60, what="pod a routable")
                with Traffic(base).running() as traffic:
                    wait_until(lambda: traffic.done >= 2, 60, what="traffic flowing")

                    # b appears mid-run: Pending (no IP, nothing happens), then Ready.
                    b.pod(kube)
                    kube.call(kube.api.set_ready, "b", True, namespace=NAMESPACE)
                    wait_until(
                        lambda: routable(base) == {a.instance_id, b.instance_id},
                        60,
                        what="pod b routable",
                    )
                    # Requests reach b: the router's KV index (fed by b's own KV events, at
                    # the port its pod annotation names) holds a prompt only b served.
                    with openai.OpenAI(base_url=base + "/v1", api_key="none") as client:
                        holders = []
                        for n in range(40):
                            body = {
                                "model": MODEL,
                                "max_tokens": 4,
                                "messages": [{"role": "user", "content": f"{n} " * 40}],
                            }
                            client.chat.completions.create(**body)
                            holders.append(
                                wait_until(lambda body=body: holder(base, body, a, b), 30)
                            )
                            if holders[-1] == "b":
                                break
                        assert holders[-1] == "b", f"no request went to pod b: {holders}"

                    # The API server goes away for a while: the stack keeps serving what it
                    # knows, and fleet picks the watch up again when it is back.
                    kube.call(kube.api.stop)
                    seen = traffic.done
                    wait_until(
                        lambda: "cannot reach" in procs.log("fleet"), 60, what="fleet retrying"
                    )
                    wait_until(lambda: traffic.done >= seen + 3, 60, what="traffic, API down")
                    assert routable(base) == {a.instance_id, b.instance_id}
                    kube.call(kube.api.start)

                    # a goes unready (its readiness probe fails, e.g. it drains): no more
                    # requests for it, then its engine exits and the pod is deleted.
                    seen = traffic.done
                    kube.call(kube.api.set_ready, "a", False, namespace=NAMESPACE)
                    wait_until(lambda: routable(base) == {b.instance_id}, 60, what="a removed")
                    wait_until(lambda: traffic.done >= seen + 3, 60, what="traffic after a")
                    procs.kill("engine-a")
                    kube.call(kube.api.delete_pod, "a", namespace=NAMESPACE)
                    seen = traffic.done
                    wait_until(lambda: traffic.done >= seen + 3, 60, what="traffic on b alone")
                assert traffic.failures == [], traffic.failures
                fleet_log = procs.log("fleet")
                assert "pod llm/b is a worker" in fleet_log
                assert "pod llm/a is no longer a worker" in fleet_log
                assert "recovered" in fleet_log  # the watch, after the outage
                for name in ("router", "dispatcher", "preprocessor", "fleet", "engine-b"):
                    assert procs.procs[name].poll() is None, f"{name} exited"
            except AssertionError as exc:
                logs = "\n".join(f"--- {n}\n{procs.log(n)[-2000:]}" for n in procs.procs)
                raise AssertionError(f"{exc}\n{logs}") from None
    finally:
        kube.close()
