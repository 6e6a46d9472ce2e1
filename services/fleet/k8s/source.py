"""Workers from Kubernetes pods: one list + watch per label selector (e.g. a prefill pool and
a decode pool), all in one namespace, merged into one worker list.

Fleet calls `workers()` after `wait_changed()` returns and hands the list to the same
registry diff as the workers file, so the rest of the stack sees Added/Removed/Updated events
whatever the list came from. A pod that is Ready but misconfigured (a missing named port, a
bad role label) is left out and logged once per problem.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from switchyard.common.workers import WorkerSpec
from switchyard.fleet.k8s.pods import PodProblem, PodRules, pod_key, worker_of
from switchyard.fleet.k8s.selector import parse_selector
from switchyard.fleet.k8s.types import PodLister
from switchyard.fleet.k8s.watch import Backoff, PodWatch

if TYPE_CHECKING:
    from switchyard.fleet.k8s.client import PodApi

# Where a pod's service account is mounted (token, ca.crt, namespace).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

log = logging.getLogger(__name__)


class PodSource:
    def __init__(
        self,
        selectors: Sequence[str],
        rules: PodRules | None = None,
        *,
        namespace: str | None = None,
        kubeconfig: str | None = None,
        service_account: Path = SERVICE_ACCOUNT,
        api: PodLister | None = None,
        watch_timeout_s: int = 300,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ) -> None:
        if not selectors:
            raise ValueError("give at least one pod selector")
        for selector in selectors:
            parse_selector(selector)  # ValueError naming the problem
        self.selectors = list(dict.fromkeys(selectors))
        self.rules = rules or PodRules()
        self._namespace = namespace
        self._kubeconfig = kubeconfig
        self._service_account = service_account
        self._api = api
        self._client: PodApi | None = None  # the API client this source made (and closes)
        self._watch_timeout_s = watch_timeout_s
        self._backoff = (backoff_base, backoff_cap)
        self._watches: list[PodWatch] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._problems: dict[str, str] = {}  # pod uid -> problem logged
        self._serving: dict[str, str] = {}  # pod key -> url, pods that are workers now

    @property
    def synced(self) -> bool:
        """Every selector has been listed at least once."""
        return bool(self._watches) and all(w.synced for w in self._watches)

    @property
    def watches(self) -> list[PodWatch]:
        return list(self._watches)

    async def start(self) -> None:
        """Load the cluster configuration (ConfigError when there is none) and start watching.
        Returns at once: an unreachable API server is retried in the background."""
        if self._api is None:
            # Imported here: the client library takes a second or more to load, which no
            # other service (nor a fleet without pods) should pay.
            from switchyard.fleet.k8s.client import PodApi

            self._client = await PodApi.connect(
                self._kubeconfig, self._namespace, self._service_account
            )
            self._api = self._client
        api = self._api
        log.info(
            "watching pods on %s, namespace %s, selector(s) %s",
            api.where,
            api.namespace,
            "; ".join(repr(s) for s in self.selectors),
        )
        self._watches = [
            PodWatch(
                api,
                selector,
                self._changed.set,
                backoff=Backoff(*self._backoff),
                watch_timeout_s=self._watch_timeout_s,
            )
            for selector in self.selectors
        ]
        self._tasks = [
            asyncio.create_task(w.run(), name=f"pod-watch {w.selector}") for w in self._watches
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._client is not None:
            await self._client.close()
            self._client = self._api = None

    async def wait_changed(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    def workers(self) -> list[WorkerSpec]:
        """The Ready pods of every selector as workers, ordered by url."""
        pods: dict[str, dict[str, Any]] = {}
        for watch in self._watches:
            pods.update(watch.pods)  # a pod two selectors pick is one worker
        by_id: dict[int, WorkerSpec] = {}
        serving: dict[str, str] = {}
        for uid, pod in sorted(pods.items(), key=lambda item: pod_key(item[1])):
            try:
                spec = worker_of(pod, self.rules)
            except PodProblem as exc:
                self._problem(uid, pod, str(exc))
                continue
            self._problems.pop(uid, None)
            if spec is None:
                continue
            if by_id.setdefault(spec.instance_id, spec) is not spec:
                self._problem(uid, pod, f"{spec.url} is already served by another pod")
                continue
            serving[pod_key(pod)] = spec.url
        self._log_transitions(serving)
        for uid in [uid for uid in self._problems if uid not in pods]:
            del self._problems[uid]
        return sorted(by_id.values(), key=lambda spec: spec.url)

    def _problem(self, uid: str, pod: dict[str, Any], problem: str) -> None:
        if self._problems.get(uid) != problem:
            log.warning("pod %s left out: %s", pod_key(pod), problem)
            self._problems[uid] = problem

    def _log_transitions(self, serving: dict[str, str]) -> None:
        for key, url in serving.items():
            if self._serving.get(key) != url:
                log.info("pod %s is a worker: %s", key, url)
        for key, url in self._serving.items():
            if key not in serving:
                log.info("pod %s is no longer a worker (%s)", key, url)
        self._serving = serving


def merge_workers(listed: Sequence[WorkerSpec], pods: Sequence[WorkerSpec]) -> list[WorkerSpec]:
    """Listed workers (flags, workers file) plus the pods'; a listed URL keeps its options."""
    by_id = {spec.instance_id: spec for spec in pods}
    by_id.update({spec.instance_id: spec for spec in listed})
    return sorted(by_id.values(), key=lambda spec: spec.url)
