"""The router's decision metrics expose exactly what prometheus-client's Histogram and Counter
did."""

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from switchyard.router.kv.index import KvIndex
from switchyard.router.metrics import (
    _LATENCY_BUCKETS,
    _RATIO_BUCKETS,
    _TTFT_BUCKETS,
    RouterMetrics,
)

HISTOGRAMS = {
    "latency": ("switchyard_router_decision_seconds", _LATENCY_BUCKETS),
    "hit_ratio": ("switchyard_router_predicted_hit_ratio", _RATIO_BUCKETS),
    "predicted_ttft": ("switchyard_router_predicted_ttft_seconds", _TTFT_BUCKETS),
}
# Every bound itself (le is inclusive), between bounds, below the first, above the last.
VALUES = [0.0, 1e-5, 3e-5, 1e-3, 0.1, 0.25, 0.3, 0.99, 1.0, 1.5, 10.0, 99.0]


def series(registry: CollectorRegistry, name: str) -> list[str]:
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if line.startswith((name, f"# HELP {name} ", f"# TYPE {name} "))
    ]


def test_same_series_as_prometheus_histograms() -> None:
    metrics = RouterMetrics(KvIndex())
    theirs = CollectorRegistry()
    for attribute, (name, buckets) in HISTOGRAMS.items():
        ours = getattr(metrics, attribute)
        reference = Histogram(name, ours.documentation, buckets=buckets, registry=theirs)
        for value in VALUES:
            ours.observe(value)
            reference.observe(value)
        expected = [line for line in series(theirs, name) if "_created" not in line]
        assert series(metrics.registry, name) == expected
        assert len(expected) == len(buckets) + 5  # +Inf, sum, count, HELP, TYPE


def test_same_series_as_prometheus_counters() -> None:
    metrics = RouterMetrics(KvIndex())
    theirs = CollectorRegistry()
    for ours, labels in (
        (metrics.decisions, ["mode", "model"]),
        (metrics.routed, ["model", "worker"]),
    ):
        reference = Counter(ours.name, ours.documentation, labels, registry=theirs)
        for values in [("a", "m"), ("b", "m"), ("a", "m"), ("a", "n")]:
            ours.inc_labels(values)
            reference.labels(*values).inc()
        name = f"{ours.name}_total"
        expected = [line for line in series(theirs, ours.name) if "_created" not in line]
        assert series(metrics.registry, ours.name) == expected
        assert f'{name}{{{labels[0]}="a",{labels[1]}="m"}} 2.0' in expected
