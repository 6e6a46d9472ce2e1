"""Using the test API server (`k8s_api`) from tests: a kubeconfig that points at it, and
the server on its own event loop in a thread, for tests that are not async."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import threading
from collections.abc import Callable
from typing import Any

from support.k8s_api import FakeKubeApi


class ThreadedFakeKubeApi:
    """A FakeKubeApi on its own event loop in a thread; `call(fn, *args)` runs a method there
    (awaiting it when it is a coroutine) and returns its result."""

    _names = itertools.count()

    def __init__(self, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"fake-kube-api-{next(self._names)}", daemon=True
        )
        self._thread.start()
        self.api: FakeKubeApi = self.call(lambda: FakeKubeApi(**kwargs))

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def run() -> Any:
            result = fn(*args, **kwargs)
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def close(self) -> None:
        try:
            self.call(self.api.stop)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


def kubeconfig(
    server: str,
    *,
    token: str | None = None,
    namespace: str | None = None,
    ca_pem: bytes | None = None,
) -> str:
    """A kubeconfig (YAML text) whose current context is `server`, as `kubectl config` writes
    it: clusters, users and contexts by name; `ca_pem` the CA that signed the server's
    certificate (certificate-authority-data)."""
    context: dict[str, Any] = {"cluster": "fake", "user": "fleet"}
    if namespace is not None:
        context["namespace"] = namespace
    cluster: dict[str, Any] = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": cluster}],
        "users": [{"name": "fleet", "user": {"token": token} if token else {}}],
        "contexts": [{"name": "fake", "context": context}],
        "current-context": "fake",
    }
    return json.dumps(config, indent=2)  # JSON is YAML
