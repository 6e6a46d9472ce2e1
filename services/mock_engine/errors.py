"""Errors of the mock engine.

MockEngineError                 base of everything raised here
├── ConfigError (ValueError)    a bad flag or config value, raised at startup
└── RequestRejected             a Generate request the engine refuses; the servicers
                                answer it with INVALID_ARGUMENT and its `reason`
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

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(reason)
        self.request_id = request_id
        self.reason = reason
