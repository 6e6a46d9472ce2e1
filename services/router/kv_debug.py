"""How fresh the router's view of each engine's KV cache is, for the operator: the staleness
columns of a dry run's rows (POST /debug/route) and the /debug/kv view (one worker's index
summary and event stream, or every worker's stream). Pure: reads the ingestor's per-worker
stream statistics and the index; `now` is the router's monotonic clock."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from switchyard.protos.messages import Instance, RouteResponse, WorkerScore
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.ingestor import KvIngestor
from switchyard.router.kv.types import WorkerKey, WorkerKvStats


def stream_view(stats: WorkerKvStats, now: float) -> dict[str, object]:
    age = stats.event_age(now)
    return {
        "connected": stats.connected,
        "last_seq": stats.last_seq,
        "last_event_age_s": None if age is None else round(age, 3),
        "index_lag_s": round(stats.index_lag(now), 3),
        "engine_timestamp": stats.batch_ts,
        "waiting_for_replay": stats.held_since is not None,
        "batches": stats.batches,
        "gaps": stats.gaps,
        "replays": stats.replays,
        "replay_failures": stats.replay_failures,
        "resets": stats.resets,
        "reconnects": stats.reconnects,
        "suspected_stale": stats.suspected_stale,
    }


def with_staleness(
    response: RouteResponse, ingestor: KvIngestor, index: KvIndex, now: float
) -> RouteResponse:
    """The dry run's rows with each worker's KV staleness columns filled."""
    stats = dict(ingestor.worker_stats())
    rows = [_row(row, stats, index, now) for row in response.workers]
    return msgspec.structs.replace(response, workers=rows)


def _row(
    row: WorkerScore, stats: dict[WorkerKey, WorkerKvStats], index: KvIndex, now: float
) -> WorkerScore:
    key = (row.instance_id, row.dp_rank or 0)
    found = stats.get(key)
    if found is None:
        return row
    age = found.event_age(now)
    return msgspec.structs.replace(
        row,
        kv_blocks=index.size(key),
        kv_event_age_ms=-1.0 if age is None else age * 1e3,
        kv_last_seq=-1 if found.last_seq is None else found.last_seq,
        kv_lag_ms=found.index_lag(now) * 1e3,
        kv_gaps=found.gaps,
        kv_replays=found.replays,
        kv_resets=found.resets,
        kv_connected=found.connected,
        kv_suspected_stale=found.suspected_stale,
    )


def describe(
    instance_id: int | None,
    dp_rank: int,
    ingestor: KvIngestor | None,
    index: KvIndex,
    instances: Mapping[int, Instance],
    now: float,
) -> dict[str, object] | None:
    """/debug/kv: one worker (None when unknown), or every worker's stream (`instance_id`
    None)."""
    if ingestor is None:
        return {"kv_events": False, "workers": []}  # a policy that reads no KV view
    stats = dict(ingestor.worker_stats())
    if instance_id is None:
        workers = []
        for (iid, rank), each in sorted(stats.items()):
            instance = instances.get(iid)
            workers.append(
                {
                    "instance_id": iid,
                    "dp_rank": rank,
                    "url": instance.url if instance else None,
                    "blocks": index.size((iid, rank)),
                    **stream_view(each, now),
                }
            )
        return {"kv_events": True, "workers": workers}
    instance = instances.get(instance_id)
    key = (instance_id, dp_rank)
    summary = index.summary(key)
    found = stats.get(key)
    if instance is None and summary is None and found is None:
        return None
    return {
        "instance_id": instance_id,
        "dp_rank": dp_rank,
        "url": instance.url if instance else None,
        "model": instance.model if instance else None,
        "block_size": instance.block_size if instance else None,
        "admitted_at": instance.admitted_at if instance else None,
        "events": ingestor.describe(instance_id),
        "stream": stream_view(found, now) if found is not None else None,
        "index": summary or {"device_blocks": 0, "offloaded_blocks": 0},
    }
