"""Which way an engine's KV-event publisher goes: it binds its PUB socket (consumers connect
to it) or connects it to a consumer that binds. The rule is the engines' own
(`ZmqEventPublisher._socket_setup`):

- SGLang 0.5.23: the config's `"bind"` when it says; otherwise bind when the endpoint holds
  `*`, `::` or `0.0.0.0`, or is ipc:// / inproc://; connect otherwise.
- vLLM 0.33: bind when the endpoint holds `*` or `::`, or is ipc:// / inproc://; connect
  otherwise (`tcp://0.0.0.0:P` connects).

A consumer binding for publishers that connect to `tcp://router:5557` binds the port on every
interface (`tcp://*:5557`; the name is how the engines reach it, not necessarily a local
address), or on the loopback address itself when the engines were pointed at one.
"""

from __future__ import annotations

import ipaddress

from switchyard.protos.messages import PROTOCOL_VLLM


def publisher_binds(endpoint: str, protocol: str, bind: bool | None = None) -> bool:
    if bind is not None and protocol != PROTOCOL_VLLM:
        return bind
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if "*" in endpoint or "::" in endpoint:
        return True
    return protocol != PROTOCOL_VLLM and "0.0.0.0" in endpoint


def listen_endpoint(endpoint: str) -> str:
    """Where to bind for publishers that connect to `endpoint`."""
    scheme, sep, rest = endpoint.partition("://")
    if scheme != "tcp" or not sep:
        return endpoint
    host, colon, port = rest.rpartition(":")
    if not colon:
        return endpoint
    try:
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return endpoint
    except ValueError:
        pass
    return f"tcp://*:{port}"
