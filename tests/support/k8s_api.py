"""A Kubernetes API server for pods that speaks the real list/watch wire, for tests (no
cluster runs on a developer machine or in CI; this is what the real client talks to).

    GET /api/v1/namespaces/{ns}/pods   list: a PodList with metadata.resourceVersion, paged
                                       with limit/continue (one consistent snapshot)
    ... ?watch=true&resourceVersion=R  watch: one JSON event per line on a chunked stream,
                                       {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object"}

What it keeps of the real semantics (k8s.io/apiserver's watch cache):
- every write is one resourceVersion (an opaque string to clients; here a counter);
- a watch from R replays the writes after R, then follows live ones; from R unset or "0" it
  first sends a synthetic ADDED per existing pod; with labelSelector, a pod whose labels stop
  (start) matching is a DELETED (ADDED) for that watcher, as the cacher converts events;
- a watch from an R older than the kept history answers 200 and one ERROR event carrying a
  Status {code 410, reason Expired} (or, with `gone_as_http`, an HTTP 410 Status); an expired
  continue token answers HTTP 410;
- allowWatchBookmarks=true gets BOOKMARK events (a Pod with only metadata.resourceVersion) on
  `send_bookmarks()` and every `bookmark_interval` seconds; timeoutSeconds ends a watch
  cleanly; errors are Status objects with the HTTP code; a bearer token is required when set.

Faults: `stop()`/`start()` (an outage: connections refused), `break_watches()` (streams cut
mid-chunk), `compact()` (old resourceVersions expire), `fail_next()` (5xx/4xx answers).
State changes are plain methods, called on the server's event loop; `k8s_harness` runs one
in a thread for tests that are not async and writes kubeconfigs for it.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from support import k8s_wire as wire
from switchyard.fleet.k8s.selector import Selector, parse_selector

Pod = dict[str, Any]


@dataclass(frozen=True)
class _Event:
    version: int
    kind: str  # ADDED | MODIFIED | DELETED
    pod: Pod  # the new state (the last state, for DELETED)
    prev: Pod | None  # the state before (None for ADDED)


@dataclass(eq=False)  # one per watch request, hashed by identity
class _Watcher:
    namespace: str
    selector: Selector
    bookmarks: bool
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    request: web.Request | None = None


@dataclass(frozen=True)
class Request:
    """One request the server answered, for tests to check what the client asked."""

    path: str
    query: Mapping[str, str]

    @property
    def watch(self) -> bool:
        return wire.parse_bool(self.query.get("watch", "false"))


class FakeKubeApi:
    def __init__(
        self,
        *,
        token: str | None = None,
        bookmark_interval: float | None = None,
        gone_as_http: bool = False,
        first_version: int = 1000,
    ) -> None:
        self.token = token
        self.bookmark_interval = bookmark_interval
        self.gone_as_http = gone_as_http
        self._version = first_version
        self._pods: dict[tuple[str, str], Pod] = {}
        self._ips: dict[tuple[str, str], str] = {}  # the IP a pod gets once it runs
        self._history: list[_Event] = []
        self._compacted = first_version  # watches from a version below this are 410
        self._snapshots: dict[int, list[Pod]] = {}  # version -> pods, for continue tokens
        self._watchers: set[_Watcher] = set()
        self._failures: list[tuple[int, str, str]] = []
        self.requests: list[Request] = []
        self._runner: web.AppRunner | None = None
        self._ssl: ssl.SSLContext | None = None
        self.host = "127.0.0.1"
        self.port = 0

    # ---- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> str:
        """Listen (again, on the same port and with the same TLS after `stop`, unless told
        otherwise). With `ssl_context` it serves HTTPS, as every real API server does."""
        if ssl_context is not None:
            self._ssl = ssl_context
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._pods_handler)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(
            runner,
            host,
            self.port if port is None else port,
            reuse_address=True,
            ssl_context=self._ssl,
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.host = host
        self.port = runner.addresses[0][1]
        return self.url

    async def stop(self) -> None:
        """Close the listener and every connection: clients see the API server go away."""
        self.break_watches()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # ---- state changes: each one write, one resourceVersion ------------------------------

    @property
    def resource_version(self) -> str:
        return str(self._version)

    def pod(self, name: str, namespace: str = "default") -> Pod:
        return copy.deepcopy(self._pods[(namespace, name)])

    def create_pod(
        self,
        name: str,
        *,
        namespace: str = "default",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        ports: Mapping[str, int] | None = None,
        ip: str = "127.0.0.1",
        ready: bool = False,
    ) -> Pod:
        """A scheduled pod; `ready` makes it Running and Ready with its IP at once,
        otherwise it is Pending with no IP until `set_ready`."""
        if (namespace, name) in self._pods:
            raise ValueError(f"pod {namespace}/{name} already exists")
        pod: Pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": wire.now(),
                "labels": dict(labels or {}),
                "annotations": dict(annotations or {}),
            },
            "spec": {
                "containers": [
                    {
                        "name": "engine",
                        "image": "switchyard:local",
                        "ports": [
                            {"name": port_name, "containerPort": number, "protocol": "TCP"}
                            for port_name, number in (ports or {}).items()
                        ],
                    }
                ],
                "restartPolicy": "Always",
                "nodeName": "node-1",
            },
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "qosClass": "Burstable",
            },
        }
        if not pod["metadata"]["annotations"]:
            del pod["metadata"]["annotations"]
        self._ips[(namespace, name)] = ip
        if ready:
            self._set_running(pod, True)
        self._write("ADDED", pod, None)
        return copy.deepcopy(pod)

    def set_ready(self, name: str, ready: bool, namespace: str = "default") -> Pod:
        """The kubelet's status update: Running with its IP, Ready True or False."""
        return self.update_pod(name, lambda pod: self._set_running(pod, ready), namespace)

    def _set_running(self, pod: Pod, ready: bool) -> None:
        meta, status = pod["metadata"], pod["status"]
        ip = self._ips[(meta["namespace"], meta["name"])]
        value = "True" if ready else "False"
        now = wire.now()
        status.update(
            phase="Running",
            hostIP="10.0.0.1",
            podIP=ip,
            podIPs=[{"ip": ip}],
            startTime=status.get("startTime", now),
            conditions=[
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": value, "lastTransitionTime": now},
                {"type": "ContainersReady", "status": value, "lastTransitionTime": now},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            ],
        )

    def update_pod(
        self, name: str, change: Callable[[Pod], None], namespace: str = "default"
    ) -> Pod:
        old = self._pods[(namespace, name)]
        pod = copy.deepcopy(old)
        change(pod)
        self._write("MODIFIED", pod, old)
        return copy.deepcopy(pod)

    def delete_pod(self, name: str, namespace: str = "default", graceful: bool = True) -> None:
        """Graceful: first the deletionTimestamp (MODIFIED, the pod is terminating), then,
        as after its containers exit, the DELETED; otherwise DELETED at once."""
        if graceful:

            def terminating(pod: Pod) -> None:
                pod["metadata"]["deletionTimestamp"] = wire.now()
                pod["metadata"]["deletionGracePeriodSeconds"] = 30

            self.update_pod(name, terminating, namespace)
        old = self._pods[(namespace, name)]
        self._write("DELETED", copy.deepcopy(old), old)

    def _write(self, kind: str, pod: Pod, prev: Pod | None) -> None:
        self._version += 1
        pod["metadata"]["resourceVersion"] = str(self._version)
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if kind == "DELETED":
            del self._pods[key]
            del self._ips[key]
        else:
            self._pods[key] = pod
        event = _Event(self._version, kind, copy.deepcopy(pod), copy.deepcopy(prev))
        self._history.append(event)
        for watcher in list(self._watchers):
            out = self._convert(event, watcher)
            if out is not None:
                watcher.queue.put_nowait(out)

    # ---- faults -------------------------------------------------------------------------

    def compact(self) -> None:
        """Forget the history (as etcd compaction does): a watch or a continue token from an
        older resourceVersion gets 410 Gone."""
        self._history.clear()
        self._snapshots.clear()
        self._compacted = self._version

    def break_watches(self) -> None:
        """Cut every open watch mid-stream (no terminating chunk: the client sees a broken
        transfer, as when a connection resets)."""
        for watcher in list(self._watchers):
            if watcher.request is not None and watcher.request.transport is not None:
                watcher.request.transport.abort()
            watcher.queue.put_nowait(None)

    def send_bookmarks(self) -> None:
        for watcher in list(self._watchers):
            if watcher.bookmarks:
                watcher.queue.put_nowait(self._bookmark())

    def fail_next(self, count: int, code: int = 500, reason: str = "InternalError") -> None:
        """The next `count` requests answer `code` with a Status."""
        message = {
            403: 'pods is forbidden: User "system:serviceaccount:default:fleet" cannot list '
            'resource "pods" in API group "" in the namespace "default"',
            429: "Too many requests, please try again later.",
        }.get(code, "an error on the server has prevented the request from succeeding")
        self._failures.extend([(code, reason, message)] * count)

    @property
    def open_watches(self) -> int:
        return len(self._watchers)

    # ---- HTTP -----------------------------------------------------------------------------

    async def _pods_handler(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append(Request(request.path, query))
        if self.token is not None:
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return wire.fail(401, "Unauthorized", "Unauthorized")
        if self._failures:
            code, reason, message = self._failures.pop(0)
            return wire.fail(code, reason, message)
        unsupported = sorted(set(query) - wire.KNOWN_PARAMS)
        if unsupported:  # honest about what this server does not implement
            message = f"this test server does not support {', '.join(unsupported)}"
            return wire.fail(400, "BadRequest", message)
        try:
            selector = parse_selector(query.get("labelSelector", ""))
        except ValueError as exc:
            return wire.fail(400, "BadRequest", f"unable to parse requirement: {exc}")
        try:
            watch = wire.parse_bool(query.get("watch", "false"))
            bookmarks = wire.parse_bool(query.get("allowWatchBookmarks", "false"))
        except ValueError as exc:
            return wire.fail(400, "BadRequest", str(exc))
        namespace = request.match_info["namespace"]
        if watch:
            return await self._watch(request, namespace, selector, query, bookmarks)
        return self._list(namespace, selector, query)

    def _list(self, namespace: str, selector: Selector, query: Mapping[str, str]) -> web.Response:
        token = query.get("continue")
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                version, start = int(state["rv"]), str(state["start"])
            except (ValueError, KeyError, TypeError):
                return wire.fail(400, "BadRequest", "continue key is not valid")
            if version not in self._snapshots:
                message = (
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter."
                )
                return wire.fail(410, "Expired", message)
            pods = [p for p in self._snapshots[version] if wire.key(p) > start]
        else:
            problem = self._check_list_version(query)
            if problem is not None:
                return problem
            version = self._version
            pods = sorted(
                (p for p in self._pods.values() if p["metadata"]["namespace"] == namespace),
                key=wire.key,
            )
            pods = [p for p in pods if selector.matches(wire.labels(p))]
        limit = int(query.get("limit") or 0)
        metadata: dict[str, Any] = {"resourceVersion": str(version)}
        if 0 < limit < len(pods):
            page = pods[:limit]
            if not token:
                self._snapshots[version] = copy.deepcopy(pods)
            state = {"rv": version, "start": wire.key(page[-1])}
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
            metadata["remainingItemCount"] = len(pods) - limit
            pods = page
        items = [{k: v for k, v in p.items() if k not in ("kind", "apiVersion")} for p in pods]
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}
        return wire.json_reply(200, body)

    def _check_list_version(self, query: Mapping[str, str]) -> web.Response | None:
        wanted = query.get("resourceVersion", "")
        if wanted in ("", "0"):
            return None
        if not wanted.isdigit():
            return wire.fail(400, "BadRequest", f"invalid resource version {wanted!r}")
        if query.get("resourceVersionMatch") == "Exact" and int(wanted) != self._version:
            return wire.fail(410, "Expired", f"too old resource version: {wanted}")
        if int(wanted) > self._version:
            message = f"Too large resource version: {wanted}, current: {self._version}"
            return wire.fail(504, "Timeout", message, details={"retryAfterSeconds": 1})
        return None

    async def _watch(
        self,
        request: web.Request,
        namespace: str,
        selector: Selector,
        query: Mapping[str, str],
        bookmarks: bool,
    ) -> web.StreamResponse:
        wanted = query.get("resourceVersion", "")
        if wanted and wanted != "0" and not wanted.isdigit():
            return wire.fail(400, "BadRequest", f"invalid resource version {wanted!r}")
        gone = bool(wanted) and wanted != "0" and int(wanted) < self._compacted
        message = f"too old resource version: {wanted} ({self._version})"
        if gone and self.gone_as_http:
            return wire.fail(410, "Expired", message)
        watcher = _Watcher(namespace, selector, bookmarks, request=request)
        # Backlog and registration without an await in between: no write falls in the gap.
        if gone:
            backlog = [{"type": "ERROR", "object": wire.status(410, "Expired", message)}]
        elif wanted in ("", "0"):
            backlog = [
                {"type": "ADDED", "object": copy.deepcopy(p)}
                for p in sorted(self._pods.values(), key=wire.key)
                if p["metadata"]["namespace"] == namespace and selector.matches(wire.labels(p))
            ]
        else:
            backlog = [
                out
                for event in self._history
                if event.version > int(wanted) and (out := self._convert(event, watcher))
            ]
        if not gone:
            self._watchers.add(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            for out in backlog:
                await response.write(wire.line(out))
            if gone:
                await response.write_eof()
                return response
            await self._follow(watcher, response, float(query.get("timeoutSeconds") or 0))
        except (ConnectionResetError, ConnectionError):
            return response
        finally:
            self._watchers.discard(watcher)
        return response

    async def _follow(
        self, watcher: _Watcher, response: web.StreamResponse, timeout: float
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout > 0 else None
        next_bookmark = (
            loop.time() + self.bookmark_interval
            if watcher.bookmarks and self.bookmark_interval
            else None
        )
        while True:
            wakeups = [t for t in (deadline, next_bookmark) if t is not None]
            wait = max(0.0, min(wakeups) - loop.time()) if wakeups else None
            try:
                out = await asyncio.wait_for(watcher.queue.get(), wait)
            except TimeoutError:
                now = loop.time()
                if deadline is not None and now >= deadline:
                    await response.write_eof()  # the server's timeout: a clean end
                    return
                assert next_bookmark is not None and self.bookmark_interval
                next_bookmark = now + self.bookmark_interval
                out = self._bookmark()
            if out is None:  # cut by break_watches
                return
            await response.write(wire.line(out))

    def _convert(self, event: _Event, watcher: _Watcher) -> dict[str, Any] | None:
        """The cacher's per-watcher view of one write."""
        if event.pod["metadata"]["namespace"] != watcher.namespace:
            return None
        now = event.kind != "DELETED" and watcher.selector.matches(wire.labels(event.pod))
        before = event.prev is not None and watcher.selector.matches(wire.labels(event.prev))
        if now:
            return {"type": "MODIFIED" if before else "ADDED", "object": copy.deepcopy(event.pod)}
        if before:
            assert event.prev is not None
            gone = copy.deepcopy(event.prev if event.kind != "DELETED" else event.pod)
            gone["metadata"]["resourceVersion"] = str(event.version)
            return {"type": "DELETED", "object": gone}
        return None

    def _bookmark(self) -> dict[str, Any]:
        # What the API server sends for pods: an empty Pod but for its resourceVersion.
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self._version), "creationTimestamp": None},
            "spec": {"containers": None},
            "status": {},
        }
        return {"type": "BOOKMARK", "object": pod}
