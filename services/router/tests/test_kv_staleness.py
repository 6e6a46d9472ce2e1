"""Staleness you can see (issue 32): the per-worker stream statistics, the suspicion that a
worker's index went stale, and how they show on /metrics, in a dry run's rows and /debug/kv."""

import logging

from prometheus_client import generate_latest

from switchyard.common.ports import free_port
from switchyard.protos.messages import Instance, InstanceAdded, RouteResponse, WorkerScore
from switchyard.router import kv_debug
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.ingestor import KvIngestor, ListenerSpec
from switchyard.router.metrics import RouterMetrics


def instance(iid: int = 1) -> Instance:
    return Instance(
        instance_id=iid,
        url=f"grpc://127.0.0.1:{40000 + iid}",
        protocol="vllm",
        model="m",
        context_length=1024,
        block_size=4,
    )


async def ingestor_with_one_worker() -> KvIngestor:
    listen = ListenerSpec("bind", f"tcp://127.0.0.1:{free_port()}")
    ing = KvIngestor(KvIndex(), open_client=None, listener=listen)
    await ing.start()
    ing.apply_events([InstanceAdded(instance())])
    return ing


class TestSuspectedStale:
    async def test_events_stopped_while_requests_run(self, caplog):
        ing = await ingestor_with_one_worker()
        try:
            stats = ing.streams(1)[0].stats
            stats.heard_at = 10.0
            ing.note_routed(1, 20.0)
            assert stats.routed_at == 20.0
            ing.note_routed(1, 25.0)
            assert stats.routed_at == 20.0  # the first since the last event counts
            assert ing.check_stale(40.0, lambda key: 1, stale_after=30.0) == []  # not yet
            with caplog.at_level(logging.WARNING):
                assert ing.check_stale(51.0, lambda key: 2, stale_after=30.0) == [(1, 0)]
            assert "suspected stale" in caplog.text and stats.suspected_stale
            assert ing.check_stale(52.0, lambda key: 2, stale_after=30.0) == []  # once
            assert ing.counters.stale_suspicions == 1
            stats.heard_at = 53.0  # an event: no longer suspected
            ing.check_stale(54.0, lambda key: 2, stale_after=30.0)
            assert not stats.suspected_stale
        finally:
            await ing.close()

    async def test_idle_worker_is_not_suspected(self):
        ing = await ingestor_with_one_worker()
        try:
            ing.note_routed(1, 20.0)
            assert ing.check_stale(100.0, lambda key: 0, stale_after=30.0) == []
        finally:
            await ing.close()


class TestViews:
    async def test_metrics_rows_and_debug_view(self):
        ing = await ingestor_with_one_worker()
        try:
            stats = ing.streams(1)[0].stats
            stats.heard_at, stats.last_seq, stats.gaps, stats.connected = 5.0, 41, 2, True
            metrics = RouterMetrics(
                ing.index,
                instances=lambda: {1: instance()},
                kv_workers=ing.worker_stats,
                clock=lambda: 7.5,
            )
            text = generate_latest(metrics.registry).decode()
            labels = '{dp_rank="0",instance_id="1",model="m",worker="grpc://127.0.0.1:40001"}'
            for line in (
                f"switchyard_router_kv_last_event_age_seconds{labels} 2.5",
                f"switchyard_router_kv_last_seq{labels} 41.0",
                f"switchyard_router_kv_connected{labels} 1.0",
                f"switchyard_router_kv_suspected_stale{labels} 0.0",
                f"switchyard_router_kv_worker_gaps_total{labels} 2.0",
                f"switchyard_router_kv_index_lag_seconds{labels} 0.0",
                "switchyard_router_kv_reconnects_total 0.0",
            ):
                assert line in text, line
            row = WorkerScore(
                instance_id=1, url="u", overlap_blocks=0, in_flight=0, active_blocks=0,
                prefill_blocks=0, cost=0.0,
            )  # fmt: skip
            reply = RouteResponse(request_id="r", instance_id=1, workers=[row])
            filled = kv_debug.with_staleness(reply, ing, ing.index, 7.5).workers[0]
            assert (filled.kv_last_seq, filled.kv_gaps, filled.kv_event_age_ms) == (41, 2, 2500.0)
            view = kv_debug.describe(1, 0, ing, ing.index, {1: instance()}, 7.5)
            assert view is not None and view["stream"]["last_seq"] == 41
            assert view["index"]["device_blocks"] == 0
            assert kv_debug.describe(9, 0, ing, ing.index, {}, 7.5) is None
            every = kv_debug.describe(None, 0, ing, ing.index, {1: instance()}, 7.5)
            assert every is not None and every["workers"][0]["gaps"] == 2
        finally:
            await ing.close()


class TestIndexBlocksGauge:
    def test_a_known_worker_with_an_empty_entry_shows_zero(self):
        """Regression: a (re)admitted engine whose pre-admission stores were not indexed has
        no index entry; its switchyard_router_kv_index_blocks series was absent instead of 0
        (the real-engine warm-up test waited for it in vain)."""
        metrics = RouterMetrics(KvIndex(), instances=lambda: {1: instance()})
        text = generate_latest(metrics.registry).decode()
        labels = '{dp_rank="0",instance_id="1",model="m",worker="grpc://127.0.0.1:40001"}'
        assert f"switchyard_router_kv_index_blocks{labels} 0.0" in text
