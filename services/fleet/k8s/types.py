"""The pod watch's contract with the API client (implemented by `client.PodApi`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class PodPage:
    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str | None


class PodLister(Protocol):
    where: str  # the API server, for logs
    namespace: str

    async def list_pods(self, selector: str, limit: int, continue_token: str | None) -> PodPage: ...

    def watch_pods(
        self, selector: str, resource_version: str, timeout_s: int
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]: ...
