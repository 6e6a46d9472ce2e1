"""LoopHistogram exposes exactly what prometheus-client's Histogram would."""

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from switchyard.common.loop_histogram import LoopHistogram

BUCKETS = (0.01, 0.1, 1, 10)
VALUES = [0.005, 0.01, 0.05, 0.5, 0.5, 3, 30, 0.1]


def exposition(registry: CollectorRegistry) -> list[str]:
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if not line.startswith("#") and "_created" not in line
    ]


def test_same_series_as_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = LoopHistogram("x_seconds", "doc", BUCKETS, ["stage"], registry=ours)
    slow = Histogram("x_seconds", "doc", ["stage"], buckets=BUCKETS, registry=theirs)
    for v in VALUES:
        fast.labels("a").observe(v)
        slow.labels("a").observe(v)
    fast.labels("b").observe(0.2)
    fast.labels("b").observe(0.3)
    slow.labels("b").observe(0.2)
    slow.labels("b").observe(0.3)
    assert exposition(ours) == exposition(theirs)


def test_unlabelled() -> None:
    registry = CollectorRegistry()
    h = LoopHistogram("y_seconds", "doc", BUCKETS, registry=registry)
    h.observe(0.5)
    text = "\n".join(exposition(registry))
    assert 'y_seconds_bucket{le="1.0"} 1.0' in text and "y_seconds_count 1.0" in text
