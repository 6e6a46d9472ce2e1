"""Error kinds shared by every service, and the remap from engine/transport faults to them.

    SwitchyardError
     +-- EngineError(kind, instance_id, message)   an engine or the path to it failed

Kinds decide what happens next (shared/ARCHITECTURE.md, "Faults"):
    cannot_connect  instance down, migrate      UNAVAILABLE made by the transport (connect
                                                refused, reset, GOAWAY, keepalive), OSError
    refused         migrate                     UNAVAILABLE answered by the engine to this
                                                one call over a working connection
    timeout         instance down, migrate      DEADLINE_EXCEEDED
    disconnected    migrate                     a stream that ended without its final message
    overloaded      mark busy, try another      RESOURCE_EXHAUSTED
    cancelled       nothing                     CANCELLED
    bad_request     400 to the client           INVALID_ARGUMENT and kin
    engine_error    500 to the client           anything else
"""

from __future__ import annotations

import grpc

CANNOT_CONNECT = "cannot_connect"
REFUSED = "refused"
TIMEOUT = "timeout"
DISCONNECTED = "disconnected"
OVERLOADED = "overloaded"
CANCELLED = "cancelled"
BAD_REQUEST = "bad_request"
ENGINE_ERROR = "engine_error"

# Kinds after which the request may be resent to another instance.
MIGRATABLE = frozenset({CANNOT_CONNECT, REFUSED, TIMEOUT, DISCONNECTED, OVERLOADED})
# Kinds that mean the instance itself is unreachable (reported down, out of rotation until
# a probe answers). Not REFUSED: an engine that refuses one call is still serving the rest.
INSTANCE_DOWN = frozenset({CANNOT_CONNECT, TIMEOUT})

_STATUS_KIND = {
    grpc.StatusCode.UNAVAILABLE: CANNOT_CONNECT,
    grpc.StatusCode.DEADLINE_EXCEEDED: TIMEOUT,
    grpc.StatusCode.RESOURCE_EXHAUSTED: OVERLOADED,
    grpc.StatusCode.CANCELLED: CANCELLED,
    grpc.StatusCode.INVALID_ARGUMENT: BAD_REQUEST,
    grpc.StatusCode.FAILED_PRECONDITION: BAD_REQUEST,
    grpc.StatusCode.OUT_OF_RANGE: BAD_REQUEST,
    grpc.StatusCode.NOT_FOUND: BAD_REQUEST,
    grpc.StatusCode.ALREADY_EXISTS: BAD_REQUEST,
    grpc.StatusCode.UNIMPLEMENTED: BAD_REQUEST,
    grpc.StatusCode.ABORTED: DISCONNECTED,
}


def kind_of_status(code: grpc.StatusCode, connected: bool = False) -> str:
    """The kind of a call's status. `connected`: the status is the engine's own answer to
    this call, come over a connection that is still up (not one the client's transport
    made up for a connection it could not open or lost).

    UNAVAILABLE means two things in gRPC: the transport's "no connection" (refused, reset,
    GOAWAY, keepalive timeout; grpc.aio and http2.py then make the status up themselves),
    and an engine's "not this request, not now" (an engine that is draining, or whose
    scheduler cannot take the request, answers that one call UNAVAILABLE). Only the first takes
    the instance out of rotation; the second is `refused`: the request moves to another
    engine, the engine keeps serving the others."""
    if connected and code == grpc.StatusCode.UNAVAILABLE:
        return REFUSED
    return _STATUS_KIND.get(code, ENGINE_ERROR)


def kind_of_exception(exc: BaseException, connected: bool = False) -> str:
    """Remap anything raised while talking to an engine to a kind (`connected` as in
    kind_of_status, for a gRPC error)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return kind_of_status(exc.code(), connected)
    if isinstance(exc, TimeoutError):  # before OSError: TimeoutError is one
        return TIMEOUT
    if isinstance(exc, (ConnectionError, OSError)):
        return CANNOT_CONNECT
    return ENGINE_ERROR


class SwitchyardError(Exception):
    """Base of every Switchyard exception."""


class EngineError(SwitchyardError):
    """`code`: the call's gRPC status, when it had one (a kind stands for several)."""

    def __init__(
        self,
        kind: str,
        message: str,
        instance_id: int | None = None,
        code: grpc.StatusCode | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.instance_id = instance_id
        self.code = code

    @classmethod
    def from_exception(
        cls, exc: BaseException, instance_id: int | None = None, connected: bool = False
    ) -> EngineError:
        code = None
        if isinstance(exc, grpc.aio.AioRpcError):
            code = exc.code()
            message = f"{code.name}: {exc.details() or ''}".rstrip(": ")
        else:
            message = f"{type(exc).__name__}: {exc}"
        return cls(kind_of_exception(exc, connected), message, instance_id, code)

    def __repr__(self) -> str:
        return f"EngineError(kind={self.kind!r}, instance_id={self.instance_id}, {self.message!r})"
