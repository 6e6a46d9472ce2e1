"""Drive the HTTP edge (edge.Edge) the way uvicorn does, for tests: one ASGI exchange with
headers and a body; the response's status, headers and body come back."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson


class Exchange:
    def __init__(self, body: bytes) -> None:
        self._body = body
        self._sent_body = False
        self.gone = asyncio.Event()
        self.messages: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if not self._sent_body:
            self._sent_body = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.messages[0]["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])

    def json(self) -> Any:
        return orjson.loads(self.body)


async def post(app: Any, path: str, body: bytes, headers: dict[str, str] | None = None) -> Exchange:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    exchange = Exchange(body)
    await app(scope, exchange.receive, exchange.send)
    exchange.gone.set()
    return exchange
