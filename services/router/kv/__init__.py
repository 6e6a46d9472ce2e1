"""kv: the router's view of every engine's KV cache, fed by the engines' own KV events.

Layout: `types` (records, counters, worker keys), `errors`, `decode` (ZMQ frames + msgpack
events -> records), `index` (prefix index over all workers), `stream` (one publisher's
sequence and replay), `subscriber` (connect to an engine's bound PUB), `listener` (the
router's own SUBs for engines that connect), `proxy` (`switchyard kv-proxy`), `grpc_source`
(SubscribeKvEvents fallback), `ingestor` (the sources of every instance); `_index.c` (the
index's common dict operations in C, an optional extension).
"""

from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.ingestor import KvIngestor, ListenerSpec
from switchyard.router.kv.types import KvCounters, WorkerKey

__all__ = ["KvCounters", "KvIndex", "KvIngestor", "ListenerSpec", "WorkerKey"]
