"""Fleet's Prometheus metrics (served on --metrics-port, default 7190): probes by outcome,
instances by role and state, and each configured engine's state, read from the registry at
scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from switchyard.common.metrics import service_registry


class _InstancesCollector(Collector):
    def __init__(
        self,
        states: Callable[[], list[tuple[str, str]]],
        workers: Callable[[], list[tuple[str, str, str]]] | None,
    ) -> None:
        self._states = states
        self._workers = workers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self._workers is not None:
            routable = GaugeMetricFamily(
                "switchyard_fleet_worker_routable",
                "1 when the configured engine is routable, else 0 (state: routable, down, "
                "recovering, unprobed)",
                labels=["model", "worker", "state"],
            )
            for url, model, state in self._workers():
                routable.add_metric([model, url, state], 1.0 if state == "routable" else 0.0)
            yield routable
        family = GaugeMetricFamily(
            "switchyard_fleet_instances", "configured engines", labels=["role", "state"]
        )
        counts: dict[tuple[str, str], int] = {}
        for key in self._states():
            counts[key] = counts.get(key, 0) + 1
        for (role, state), n in sorted(counts.items()):
            family.add_metric([role, state], n)
        yield family


class FleetMetrics:
    def __init__(
        self,
        states: Callable[[], list[tuple[str, str]]],
        workers: Callable[[], list[tuple[str, str, str]]] | None = None,
    ) -> None:
        self.registry = service_registry("fleet")
        self.probes = Counter(
            "switchyard_fleet_probes",
            "engine probes by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.state_writes = Counter(
            "switchyard_fleet_state_writes",
            "writes of the state file (--state-file) by outcome (ok, failed)",
            ["outcome"],
            registry=self.registry,
        )
        self.registry.register(_InstancesCollector(states, workers))
