"""What the Kubernetes API side can raise.

KubeApiError        a failed call: an HTTP error or ERROR event (its Status), or a
|                   transport failure (status 0); the watch backs off and retries
+-- ResourceGone    410: the resourceVersion or continue token expired; the watch re-lists
ConfigError         (a ValueError) no usable cluster configuration; fleet fails at startup
"""

from __future__ import annotations

from typing import Any


class KubeApiError(Exception):
    """A failed API call: an HTTP error or ERROR event (its Status fields), or a transport
    failure (status 0)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def from_status(cls, status: Any, http_status: int = 0) -> KubeApiError:
        """From a Status object (a dict); any other body becomes a bare HTTP error."""
        if isinstance(status, dict) and status.get("kind") == "Status":
            code = int(status.get("code") or http_status)
            kind = ResourceGone if code == 410 else KubeApiError
            return kind(code, str(status.get("reason", "")), str(status.get("message", "")))
        kind = ResourceGone if http_status == 410 else KubeApiError
        return kind(http_status, "", f"unexpected response body: {str(status)[:200]}")


class ResourceGone(KubeApiError):
    """410 Gone: the resourceVersion (or continue token) is older than the server keeps."""


class ConfigError(ValueError):
    """No usable cluster configuration (fleet fails at startup)."""
