"""kv: the router's view of every engine's KV cache, fed by the engines' own KV events.

Layout: `types` (records, counters, sink contract), `errors`, `decode` (ZMQ frames + msgpack
events -> records), `index` (prefix index over all workers), `subscriber` (one engine's ZMQ
PUB + replay), `grpc_source` (SubscribeKvEvents fallback), `ingestor` (one source per instance).
"""

from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.ingestor import KvIngestor
from switchyard.router.kv.types import KvCounters

__all__ = ["KvCounters", "KvIndex", "KvIngestor"]
