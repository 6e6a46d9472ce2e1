"""Errors of the mock engine.

MockEngineError                 base of everything raised here
├── ConfigError (ValueError)    a bad flag or config value, raised at startup
├── RequestRejected             a Generate request the engine refuses; the servicers
│                               answer it with INVALID_ARGUMENT and its `reason`
├── KvHistoryTruncated          a KV event subscription asked to resume from a sequence the
│                               replay buffer no longer holds (OUT_OF_RANGE on gRPC)
├── HandoverMissing             prefill side: no KV on offer under a room / request id
│                               (unknown, expired, or not offered within the wait)
└── KvTransferFailed            decode side: a prompt's KV did not arrive from the prefill
                                engine (SGLang: INTERNAL; vLLM: FAILED_PRECONDITION)
"""

from __future__ import annotations


class MockEngineError(Exception):
    """Base of the mock engine's errors."""


class ConfigError(MockEngineError, ValueError):
    """A config value out of range; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class RequestRejected(MockEngineError):
    """The engine refuses a request before generating (bad input or sampling values)."""

    def __init__(
        self, request_id: str, reason: str, parameter: str | None = None, value: object = None
    ) -> None:
        super().__init__(reason)
        self.request_id = request_id
        self.reason = reason
        self.parameter = parameter  # the sampling field at fault (vLLM names it)
        self.value = value


class PromptTooLong(RequestRejected):
    """The prompt leaves no room for one output token in the context."""

    def __init__(self, request_id: str, reason: str, length: int, context: int) -> None:
        super().__init__(request_id, reason)
        self.length = length
        self.context = context


class KvHistoryTruncated(MockEngineError):
    """Resuming from `start` is impossible: the oldest buffered batch is `oldest`."""

    def __init__(self, start: int, oldest: int) -> None:
        super().__init__(f"KV event history starts at {oldest}, cannot resume from {start}")
        self.start = start
        self.oldest = oldest


TransferKey = tuple[str, int | str]  # ("room", 12) or ("request", "abc")


class HandoverMissing(MockEngineError):
    """No KV under `key`; `reason` is "unknown", "expired" or "timeout"."""

    def __init__(self, key: TransferKey, reason: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.reason = reason


class KvTransferFailed(MockEngineError):
    """A decode side's fetch of `key` failed; `reason` is the prefill side's error
    ("unknown", "expired", "timeout", "mismatch", "bad_request"), "unreachable" or "broken"."""

    def __init__(self, key: TransferKey, reason: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.reason = reason
