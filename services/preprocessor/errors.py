"""Errors raised by the preprocessor, and their OpenAI-shaped JSON body.

    Exception
     +-- RequestError(status, message, type, code, param)   becomes an HTTP error at the edge
     |    +-- InvalidRequestError        400  invalid_request_error
     |    |     codes: invalid_json, missing_field, invalid_type, invalid_value,
     |    |            unknown_field, unsupported_value, context_length_exceeded
     |    +-- ModelNotFoundError         404  not_found_error       code model_not_found
     |    +-- ObjectNotFoundError        404  invalid_request_error a stored response,
     |    |                                   conversation or item that is not there (or
     |    |                                   another key's: the same answer)
     |    +-- ServiceUnavailableError    503  service_unavailable   code no_engine_available,
     |    |                                                          shutting_down,
     |    |                                                          store_unavailable, ...
     |    +-- AuthenticationError        401  invalid_request_error code invalid_api_key
     |    +-- RateLimitError             429  rate_limit_error      code rate_limit_exceeded,
     |    |                                   ttft_objective_unattainable (flow control)
     |    |                                   (retry_after: the Retry-After header, seconds)
     |    +-- DeadlineExceededError      504  timeout_error         code request_timeout
     +-- NoWorker(reason, model)              no engine can take the request (router's reason)
     +-- TokenizerLoadError                   a tokenizer folder or zip could not be loaded

`code` is a stable string clients may branch on; `message` is for humans.
"""

from __future__ import annotations

import logging

import orjson

from switchyard.common import errors as kinds
from switchyard.common.errors import EngineError
from switchyard.preprocessor.storage.errors import StoreUnavailable

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVICE_UNAVAILABLE = "service_unavailable"

INVALID_JSON = "invalid_json"
MISSING_FIELD = "missing_field"
INVALID_TYPE = "invalid_type"
INVALID_VALUE = "invalid_value"
UNKNOWN_FIELD = "unknown_field"
UNSUPPORTED_VALUE = "unsupported_value"  # a valid OpenAI value this server cannot honour
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
MODEL_NOT_FOUND = "model_not_found"
NO_ENGINE_AVAILABLE = "no_engine_available"
NOT_FOUND_CODE = "not_found"
STORE_UNAVAILABLE = "store_unavailable"


def error_body(message: str, type: str, code: str, param: str | None = None) -> bytes:
    """OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


class RequestError(Exception):
    """A request that fails with an HTTP status and an OpenAI error body."""

    def __init__(
        self, status: int, message: str, type: str, code: str, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Response headers the error's status calls for (none by default)."""
        return []

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, code={self.code!r}, "
            f"param={self.param!r}, message={self.message!r})"
        )


class InvalidRequestError(RequestError):
    def __init__(self, message: str, code: str = INVALID_VALUE, param: str | None = None) -> None:
        super().__init__(400, message, INVALID_REQUEST, code, param)


class ModelNotFoundError(RequestError):
    def __init__(self, model: str) -> None:
        super().__init__(
            404, f"The model '{model}' does not exist.", NOT_FOUND, MODEL_NOT_FOUND, "model"
        )


class ObjectNotFoundError(RequestError):
    def __init__(self, message: str, code: str = NOT_FOUND_CODE, param: str | None = None) -> None:
        super().__init__(404, message, INVALID_REQUEST, code, param)


class ServiceUnavailableError(RequestError):
    def __init__(self, message: str, code: str = NO_ENGINE_AVAILABLE) -> None:
        super().__init__(503, message, SERVICE_UNAVAILABLE, code)


SHUTTING_DOWN = "shutting_down"


class AuthenticationError(RequestError):
    """401: no key, or not one of the configured keys (the key itself is never echoed)."""

    def __init__(self, message: str) -> None:
        super().__init__(401, message, INVALID_REQUEST, "invalid_api_key")

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"www-authenticate", b'Bearer realm="switchyard"')]


class RateLimitError(RequestError):
    """429: over the admission limits; the client may retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int, code: str = "rate_limit_exceeded") -> None:
        super().__init__(429, message, "rate_limit_error", code)
        self.retry_after = retry_after

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after).encode())]


class DeadlineExceededError(RequestError):
    """504: the request ran past its deadline (--request-timeout or request-timeout-ms)."""

    def __init__(self, timeout: float) -> None:
        super().__init__(
            504,
            f"The request did not complete within its deadline of {timeout:g}s.",
            "timeout_error",
            "request_timeout",
        )


class ShuttingDownError(ServiceUnavailableError):
    def __init__(self, message: str = "The server is shutting down; retry elsewhere.") -> None:
        super().__init__(message, SHUTTING_DOWN)


class NoWorker(Exception):
    """No instance can take the request: `reason` is the router's error code."""

    def __init__(self, reason: str, message: str, model: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.model = model


class TokenizerLoadError(Exception):
    """A tokenizer folder or zip is missing files, malformed, or unsafe to unpack."""


def renamed(
    err: RequestError,
    names: dict[str, str],
    words: tuple[tuple[str, str], ...] = (),
) -> RequestError:
    """A shared stage's error naming a chat field (`messages[2].content`), in the words of
    the API the request came in: `names` maps chat's top-level field to that API's (a list
    index is dropped with it: another API's indexes differ), `words` rewrites the message."""
    param = err.param
    if param is None:
        return err
    head = param.split("[", 1)[0].split(".", 1)[0]
    new = names.get(head)
    if new is None:
        return err
    message = err.message.replace(f"'{head}'", f"'{new}'")
    for old, replacement in words:
        message = message.replace(old, replacement)
    new_param = new if param[len(head) : len(head) + 1] == "[" else new + param[len(head) :]
    return RequestError(err.status, message, err.type, err.code, new_param)


ENGINE_REJECTED = "engine_rejected"


def as_request_error(exc: BaseException) -> RequestError:
    """Any failure of a request -> the client-facing error (logged when unexpected)."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, StoreUnavailable):
        # The cause (a host, a path) is in the preprocessor's log, not for the client.
        return ServiceUnavailableError(
            "The response store (responses, conversations) is unavailable; retry later.",
            STORE_UNAVAILABLE,
        )
    if isinstance(exc, NoWorker):
        if exc.reason == "unknown_model":
            return ModelNotFoundError(exc.model)
        if exc.reason == "all_busy":
            return ServiceUnavailableError(
                f"Every engine serving {exc.model!r} is overloaded; retry later.", "overloaded"
            )
        return ServiceUnavailableError(str(exc))
    if isinstance(exc, EngineError):
        if exc.kind == kinds.BAD_REQUEST:
            return RequestError(
                400,
                f"The engine rejected the request: {exc.message}",
                INVALID_REQUEST,
                ENGINE_REJECTED,
            )
        if exc.kind in kinds.MIGRATABLE:
            return ServiceUnavailableError(
                f"No engine could serve the request: {exc.message}", "engine_unavailable"
            )
        return RequestError(
            500, f"The engine failed: {exc.message}", "server_error", "engine_error"
        )
    log.exception("unexpected failure", exc_info=exc)
    return RequestError(500, "Internal error", "server_error", "internal_error")
