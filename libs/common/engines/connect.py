"""Open a channel to an engine URL and learn which family it speaks.

Detection calls HealthCheck on each family's service: the engine answers its own and says
UNIMPLEMENTED for the other's. `grpcs://` URLs get a TLS channel (see tls.py), never a
plaintext one; a TLS failure says so in the error.
"""

from __future__ import annotations

import functools
from urllib.parse import urlsplit

import grpc

from switchyard.common import errors
from switchyard.common.engines.base import (
    CHANNEL_OPTIONS,
    KEEPALIVE_TIME_MS,
    KEEPALIVE_TIMEOUT_MS,
    EngineClient,
)
from switchyard.common.engines.http2 import Http2Streams
from switchyard.common.engines.sglang import SglangClient
from switchyard.common.engines.tls import TLS_SCHEME, EngineTls
from switchyard.common.engines.vllm import VllmClient
from switchyard.common.errors import EngineError
from switchyard.common.instance_id import grpc_target, normalize_url
from switchyard.protos.messages import PROTOCOL_SGLANG, PROTOCOL_VLLM

CLIENTS: dict[str, type[EngineClient]] = {PROTOCOL_SGLANG: SglangClient, PROTOCOL_VLLM: VllmClient}


def is_tls(url: str) -> bool:
    return normalize_url(url).startswith(TLS_SCHEME + "://")


def open_channel(url: str, tls: EngineTls | None = None) -> grpc.aio.Channel:
    """A channel to the engine at `url`: TLS for grpcs:// (with `tls`, else the system's
    roots), plaintext for grpc://."""
    target = grpc_target(url)
    if is_tls(url):
        tls = tls or EngineTls()
        return grpc.aio.secure_channel(
            target, tls.credentials(), options=CHANNEL_OPTIONS + tls.options()
        )
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


def open_streams(url: str, tls: EngineTls | None = None) -> Http2Streams:
    """The HTTP/2 streams transport to the engine at `url` (TLS as open_channel's)."""
    parts = urlsplit(normalize_url(url))
    host, port = parts.hostname or "", parts.port or 0
    if not is_tls(url):
        context, server_name = None, None
    else:
        tls = tls or EngineTls()
        context, server_name = tls.ssl_context(), tls.server_name or host
    return Http2Streams(
        host,
        port,
        ssl_context=context,
        server_hostname=server_name,
        keepalive_time=KEEPALIVE_TIME_MS / 1000,
        keepalive_timeout=KEEPALIVE_TIMEOUT_MS / 1000,
    )


def client_for(
    protocol: str,
    url: str,
    instance_id: int | None = None,
    tls: EngineTls | None = None,
    *,
    http2_streams: bool = False,
) -> EngineClient:
    """A client for an engine whose family is already known (the dispatcher's case);
    `http2_streams`: its Generate streams and unary calls on the loop's own HTTP/2 connection
    (http2.py), its gRPC channel opened only when a call needs it (Abort, Embed, ...)."""
    if not http2_streams:
        return CLIENTS[protocol](open_channel(url, tls), instance_id)
    return CLIENTS[protocol](
        functools.partial(open_channel, url, tls), instance_id, open_streams(url, tls)
    )


_TLS_HINTS = ("ssl", "tls", "handshake", "certificate", "x509")
# A TLS 1.3 server that refuses the client's certificate (or has none) closes the connection
# after the handshake: the client only sees the socket closed.
_CLOSED_HINTS = ("socket closed", "connection reset")


def _tls_failure(url: str, exc: EngineError) -> EngineError:
    """A cannot-connect on a grpcs:// URL that the transport blames on TLS, said plainly."""
    text = exc.message.lower()
    if exc.kind != errors.CANNOT_CONNECT:
        return exc
    if any(h in text for h in _TLS_HINTS):
        why = (
            "does the engine serve TLS, with a certificate --engine-ca trusts, for this host "
            "or --engine-server-name?"
        )
    elif any(h in text for h in _CLOSED_HINTS):
        why = (
            "the engine closed the connection: does it want a client certificate "
            "(--engine-cert/--engine-key) or plaintext (grpc://)?"
        )
    else:
        return exc
    return EngineError(exc.kind, f"TLS to {url} failed ({why}): {exc.message}", exc.instance_id)


async def connect(
    url: str,
    timeout: float = 3.0,
    instance_id: int | None = None,
    tls: EngineTls | None = None,
    *,
    http2_streams: bool = False,
) -> EngineClient:
    """Detect the family of the engine at `url`. Raises EngineError (cannot_connect when the
    engine does not answer, bad_request when it speaks neither family). `http2_streams`: the
    client's later calls go over its own HTTP/2 connection (fleet's probes; see _unary)."""
    channel = open_channel(url, tls)
    try:
        for cls in (SglangClient, VllmClient):
            client = cls(channel, instance_id)
            try:
                await client.health(timeout)
            except EngineError as exc:
                if exc.kind == errors.BAD_REQUEST:  # UNIMPLEMENTED: not this family
                    continue
                raise _tls_failure(url, exc) if is_tls(url) else exc from None
            if http2_streams:  # the detection's channel is not needed again
                await channel.close()
                return cls(
                    functools.partial(open_channel, url, tls), instance_id, open_streams(url, tls)
                )
            return client
    except BaseException:
        await channel.close()
        raise
    await channel.close()
    raise EngineError(errors.BAD_REQUEST, f"{url} speaks neither SGLang nor vLLM gRPC", instance_id)
