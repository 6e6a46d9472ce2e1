"""Fleet's Prometheus metrics (served on --metrics-port): probes by outcome, and instances by
role and state, read from the registry at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class _InstancesCollector(Collector):
    def __init__(self, states: Callable[[], list[tuple[str, str]]]) -> None:
        self._states = states

    def collect(self) -> Iterator[GaugeMetricFamily]:
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
    def __init__(self, states: Callable[[], list[tuple[str, str]]]) -> None:
        self.registry = CollectorRegistry()
        self.probes = Counter(
            "switchyard_fleet_probes",
            "engine probes by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.registry.register(_InstancesCollector(states))
