"""LoopCounter exposes exactly what prometheus-client's Counter would (but `_created`)."""

from prometheus_client import CollectorRegistry, Counter, generate_latest

from switchyard.common.loop_counter import LoopCounter


def exposition(registry: CollectorRegistry) -> list[str]:
    return [
        line for line in generate_latest(registry).decode().splitlines() if "_created" not in line
    ]


def test_same_series_as_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = LoopCounter("x_replies", "replies sent", registry=ours)
    slow = Counter("x_replies", "replies sent", registry=theirs)
    for amount in (1, 5, 12):
        fast.inc(amount)
        slow.inc(amount)
    fast.inc()
    slow.inc()
    assert exposition(ours) == exposition(theirs)
    assert "x_replies_total 19.0" in exposition(ours)


def test_a_total_suffix_is_not_doubled() -> None:
    registry = CollectorRegistry()
    LoopCounter("y_total", "doc", registry=registry).inc(2)
    assert "y_total 2.0" in exposition(registry)


def test_labelled_series_as_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = LoopCounter("z_routed", "requests routed", ours, ["model", "worker"])
    slow = Counter("z_routed", "requests routed", ["model", "worker"], registry=theirs)
    assert exposition(ours) == exposition(theirs)  # no series yet: HELP and TYPE only
    for model, worker, amount in [("m", "a", 1), ("m", "b", 3), ("n", "a", 1), ("m", "a", 2)]:
        fast.inc_labels((model, worker), amount)
        slow.labels(model, worker).inc(amount)
    assert exposition(ours) == exposition(theirs)
    assert 'z_routed_total{model="m",worker="a"} 3.0' in exposition(ours)
