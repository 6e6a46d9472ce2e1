"""Engine adapters: one module per engine family behind one interface.

Layout: `base` holds the neutral interface (EngineClient, EngineInfo) and shared channel setup;
`wire` the proto bounds and logprob messages both families share; `sglang` and `vllm` adapt
each family's gRPC API; `connect` detects the family of a URL; `tls` the TLS settings of
grpcs:// channels; `http2` runs Generate streams on the event loop's own HTTP/2 connection;
`frames` reads its frames and relays plain token chunks (`_frames.c`: its C form).
"""

from switchyard.common.engines.base import EngineClient, EngineInfo
from switchyard.common.engines.connect import connect, open_channel

__all__ = ["EngineClient", "EngineInfo", "connect", "open_channel"]
