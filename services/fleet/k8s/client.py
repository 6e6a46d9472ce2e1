"""The Kubernetes API at the edge: pod list and watch over kubernetes_asyncio.

The library does what must match a real cluster: configuration (in-cluster service account,
or a kubeconfig with its contexts, TLS, client certificates, tokens and exec plugins), the
request (path, query parameters, auth headers) and the HTTP transport. Responses are read as
the API's own JSON (dicts), and the watch stream line by line, so the informer logic in
`watch` sees exactly the wire: `{"type": ..., "object": ...}` events, ERROR events carrying a
Status, and HTTP errors carrying a Status. The library is heavy to import (a second or more):
only a fleet with --k8s-selector loads this module.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client as kube_client
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.config.config_exception import ConfigException

from switchyard.fleet.k8s.errors import ConfigError, KubeApiError
from switchyard.fleet.k8s.types import PodPage

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
LIST_TIMEOUT_S = 60.0
# A watch gets no bytes while nothing changes (bookmarks come about once a minute at best), so
# its read deadline is the server-side timeout plus this margin.
WATCH_READ_MARGIN_S = 30.0


class PodApi:
    """Pods of one namespace. Create with `connect`; `close` when done."""

    def __init__(self, api_client: kube_client.ApiClient, namespace: str, where: str) -> None:
        self._api_client = api_client
        self._core = kube_client.CoreV1Api(api_client)
        self.namespace = namespace
        self.where = where  # the API server, for logs

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        namespace: str | None = None,
        service_account: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount"),
    ) -> PodApi:
        """In-cluster configuration when running in a pod and no kubeconfig is given; else
        the kubeconfig (`kubeconfig`, $KUBECONFIG, ~/.kube/config) and its current context.
        The namespace: `namespace`, else the pod's own (in-cluster) or the context's, else
        `default`. `service_account`: where a pod's token, CA and namespace are mounted.
        Raises ConfigError."""
        configuration = kube_client.Configuration()
        context_namespace: str | None = None
        try:
            if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                kube_config.load_incluster_config(
                    client_configuration=configuration,
                    token_filename=str(service_account / "token"),
                    cert_filename=str(service_account / "ca.crt"),
                )
                if (service_account / "namespace").exists():
                    context_namespace = (service_account / "namespace").read_text().strip() or None
            else:
                path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
                if not any(Path(p).expanduser().exists() for p in path.split(os.pathsep)):
                    raise ConfigError(
                        f"no kubeconfig at {path} and not running in a pod (give --kubeconfig)"
                    )
                loader = await kube_config.load_kube_config(
                    config_file=path, client_configuration=configuration, persist_config=False
                )
                context = (loader.current_context or {}).get("context") or {}
                context_namespace = context.get("namespace")
        except ConfigException as exc:
            raise ConfigError(f"Kubernetes configuration: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"Kubernetes configuration: {exc}") from None
        api_client = kube_client.ApiClient(configuration)
        where = str(configuration.host or "the API server")
        return cls(api_client, namespace or context_namespace or "default", where)

    async def close(self) -> None:
        await self._api_client.close()

    async def list_pods(self, selector: str, limit: int, continue_token: str | None) -> PodPage:
        """One page of a consistent list (resourceVersion unset: the newest data)."""
        kwargs: dict[str, Any] = {"label_selector": selector, "limit": limit}
        if continue_token:
            kwargs["_continue"] = continue_token
        body = await self._call(LIST_TIMEOUT_S, **kwargs)
        try:
            async with body:
                data = orjson.loads(await body.read())
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise KubeApiError(0, "", f"reading the pod list: {_describe(exc)}") from None
        meta = data.get("metadata") or {}
        if not isinstance(data.get("items"), list) or "resourceVersion" not in meta:
            raise KubeApiError(0, "", "a pod list without items or resourceVersion")
        return PodPage(data["items"], str(meta["resourceVersion"]), meta.get("continue") or None)

    async def watch_pods(
        self, selector: str, resource_version: str, timeout_s: int
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """(type, object) events after `resource_version`, bookmarks included, until the
        server ends the stream (about `timeout_s`). An ERROR event or a broken stream raises
        KubeApiError (ResourceGone for 410)."""
        body = await self._call(
            timeout_s + WATCH_READ_MARGIN_S,
            label_selector=selector,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
        )
        async with body:
            try:
                async for line in body.content:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    kind, obj = event.get("type"), event.get("object")
                    if kind == "ERROR":
                        raise KubeApiError.from_status(obj)
                    if not isinstance(kind, str) or not isinstance(obj, dict):
                        raise KubeApiError(0, "", f"malformed watch event: {line[:200]!r}")
                    yield kind, obj
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise KubeApiError(0, "", f"watch stream broke: {_describe(exc)}") from None
            except orjson.JSONDecodeError as exc:
                raise KubeApiError(0, "", f"undecodable watch event: {exc}") from None

    async def _call(self, read_timeout: float, **kwargs: Any) -> aiohttp.ClientResponse:
        """GET the namespace's pods; a non-2xx answer raises with its Status."""
        try:
            # _preload_content=False: the raw aiohttp response, not a V1PodList.
            response: aiohttp.ClientResponse = await self._core.list_namespaced_pod(  # type: ignore[assignment]
                self.namespace,
                _preload_content=False,
                _request_timeout=(CONNECT_TIMEOUT_S, read_timeout),
                **kwargs,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeApiError(0, "", f"cannot reach {self.where}: {_describe(exc)}") from None
        except kube_client.ApiException as exc:  # raised before the request (e.g. auth)
            raise KubeApiError(exc.status or 0, str(exc.reason), str(exc.body or "")) from None
        if 200 <= response.status < 300:
            return response
        async with response:
            raw = await response.read()
        try:
            status = orjson.loads(raw)
        except orjson.JSONDecodeError:
            status = raw.decode(errors="replace")
        raise KubeApiError.from_status(status, response.status)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
