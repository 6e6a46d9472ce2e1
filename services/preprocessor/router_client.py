"""The preprocessor's side of the router channel: route requests and progress notices.

Several router replicas may run side by side; each request goes to a connected one (in turn).
When none answers, the preprocessor keeps serving: `LocalFallback` keeps the instances fleet
reports that could take the request with no prefill hop, by the router's own rules
(switchyard.common.candidates: the model, the fields it requires, not excluded, not
prefill-only, prefilling themselves), and round-robins over them; the caller is told
(`fallback` in the reply's policy) so it can log and count it. KV routing resumes as soon as
a router is connected again.

The replicas are a `replicas.ReplicaSet`: each `--router` endpoint, and every address a
router name resolves to (a compose service, a Kubernetes headless Service), is a replica with
a DEALER of its own, followed as the name's addresses change; a retired one is closed once no
call and no routed request of its is left (the progress notices still reach it).

A route call whose router connection drops fails at once and goes to the next router (or the
fallback). A router that let a call time out (frozen, or overloaded) is skipped for
`SUSPECT_S`, or until any late reply shows it answers again, so that the requests behind
it do not each wait the route timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import zmq

from switchyard.common.candidates import RoundRobin, whole_request_engines
from switchyard.common.messaging import RequestReplyClient
from switchyard.common.replicas import RESOLVE_INTERVAL_S, ReplicaSet, Resolve, resolve_ipv4
from switchyard.protos import codec
from switchyard.protos.messages import (
    FlowAdmit,
    Instance,
    InstanceBusy,
    KvDebugReply,
    KvDebugRequest,
    RouteProgress,
    RouteRequest,
    RouteResponse,
)

log = logging.getLogger(__name__)

FALLBACK_POLICY = "local_round_robin"
KV_POLICY = "kv"  # the router's KV-aware policy: its replies predict the cached prefix
SUSPECT_S = 5.0


class _Router(RequestReplyClient):
    """One router replica. Route requests go at once, the progress notices are batched per
    loop iteration (messaging.DealerClient)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(
            endpoint,
            codec.route_response,
            key=lambda r: r.request_id,
            urgent=(RouteRequest, FlowAdmit),
        )
        self.suspect_until = 0.0  # monotonic: skipped until then (it let a call time out)
        self.drops = 0  # connections lost: a router that restarted has forgotten its state

    def on_disconnect(self) -> None:
        self.drops += 1
        super().on_disconnect()

    def send_now(self, message: Any) -> None:
        try:
            super().send_now(message)
        except zmq.ZMQError as exc:  # closing: the call times out, as from _tick
            log.warning("route request to %s not sent: %s", self.endpoint, exc)

    def handle(self, reply: Any) -> None:
        self.suspect_until = 0.0  # it answers (maybe late): no longer suspect
        if type(reply) is list:
            for one in reply:
                super().handle(one)
        else:
            super().handle(reply)


class LocalFallback:
    """Round-robin over fleet's instances that can take a whole request, for when no router
    answers (one per instance: the engine balances its own DP ranks)."""

    def __init__(self, instances: Callable[[], Mapping[int, Instance]]) -> None:
        self._instances = instances
        self._turn = RoundRobin()

    def can_route(self, model: str) -> bool:
        """Some instance could take a request for `model` (readiness; load is the call's)."""
        return bool(whole_request_engines(self._instances().values(), model))

    def route(self, request: RouteRequest) -> RouteResponse:
        candidates = whole_request_engines(
            self._instances().values(), request.model, request.exclude, request.requires
        )
        if not candidates:
            return RouteResponse(
                request_id=request.request_id,
                instance_id=None,
                error="no_worker",
                policy=FALLBACK_POLICY,
            )
        chosen = self._turn.pick(candidates, request.dry_run)
        return RouteResponse(
            request_id=request.request_id, instance_id=chosen.instance_id, policy=FALLBACK_POLICY
        )


class RouterClient:
    def __init__(
        self,
        endpoints: list[str],
        instances: Callable[[], Mapping[int, Instance]],
        on_fallback: Callable[[], None] | None = None,
        *,
        resolve: Resolve = resolve_ipv4,
        resolve_interval: float = RESOLVE_INTERVAL_S,
    ) -> None:
        self._routed_by: dict[str, _Router] = {}
        self.replicas = ReplicaSet(
            endpoints,
            _Router,
            self._busy,
            what="router",
            resolve=resolve,
            interval=resolve_interval,
        )
        self._turn = 0
        self.fallback = LocalFallback(instances)
        self._on_fallback = on_fallback
        self._warned = False

    def _busy(self, router: _Router) -> bool:
        """A call waits on it, or a request it routed still runs (only for retired ones)."""
        return router.pending() > 0 or any(r is router for r in self._routed_by.values())

    def start(self) -> None:
        self.replicas.start()

    async def wait_connected(self, timeout: float) -> bool:
        return await self.replicas.wait_connected(timeout)

    def connected(self) -> bool:
        """Some router is connected and not suspect (it answered its last call in time)."""
        now = time.monotonic()
        return any(r.connected and r.suspect_until <= now for r in self.replicas.live)

    def _connected(self) -> list[_Router]:
        routers = self.replicas.live
        if not routers:
            return []
        first = self._turn % len(routers)
        self._turn += 1
        ordered = routers[first:] + routers[:first]
        now = time.monotonic()
        return [r for r in ordered if r.connected and r.suspect_until <= now]

    def flow_leader(self) -> _Router | None:
        """The first live router that is connected and not suspect: every preprocessor
        given the same list asks the same one (the deployment's flow gate). A name's
        addresses are in sorted order (ReplicaSet), so the same holds for a name that
        resolves to several routers."""
        now = time.monotonic()
        for router in self.replicas.live:
            if router.connected and router.suspect_until <= now:
                return router
        return None

    async def route(self, request: RouteRequest, timeout: float) -> RouteResponse:
        for router in self._connected():
            try:
                reply: RouteResponse = await router.call(request.request_id, request, timeout)
            except TimeoutError:
                router.suspect_until = time.monotonic() + SUSPECT_S
                log.warning(
                    "router %s did not answer request_id=%s in %.1fs: skipped for %gs",
                    router.endpoint,
                    request.request_id,
                    timeout,
                    SUSPECT_S,
                    extra={"request_id": request.request_id},
                )
                continue
            except ConnectionError as exc:  # the router died under the call
                log.warning(
                    "route call request_id=%s: %s",
                    request.request_id,
                    exc,
                    extra={"request_id": request.request_id},
                )
                continue
            if not request.dry_run and reply.instance_id is not None:
                # its notices go to it; a reply without a worker books nothing to release
                self._routed_by[request.request_id] = router
            if self._warned:
                log.info("router %s answers again: KV-aware routing resumed", router.endpoint)
                self._warned = False
            return reply
        if not self._warned:
            log.warning("no router answers: routing locally (round-robin) until one is back")
            self._warned = True
        self.replicas.resolve_soon()  # maybe they moved
        if self._on_fallback is not None:
            self._on_fallback()
        return self.fallback.route(request)

    async def kv_debug(self, request: KvDebugRequest, timeout: float) -> KvDebugReply | None:
        """One router's KV view (GET /debug/kv); None when no router answers."""
        for router in self._connected():
            try:
                reply = await router.call(request.request_id, request, timeout)
            except (TimeoutError, ConnectionError):
                continue
            if isinstance(reply, KvDebugReply):
                return reply
        return None

    async def progress(self, request_id: str, instance_id: int, stage: str, final: bool) -> None:
        """Tell the router that routed the request; a notice to a router that died is lost
        (its bookkeeping expires)."""
        router = self._routed_by.pop(request_id, None) if final else self._routed_by.get(request_id)
        if router is not None and router.connected:
            await router.send(RouteProgress(request_id, instance_id, stage))

    async def busy(self, instance_id: int, seconds: float) -> None:
        """An engine said it is overloaded: every connected router avoids it for a while."""
        for router in self.replicas.live:
            if router.connected:
                await router.send(InstanceBusy(instance_id, seconds))

    async def close(self) -> None:
        await self.replicas.close()


async def route_around(
    router: RouterClient, request: RouteRequest, timeout: float, refused: list[int]
) -> RouteResponse:
    """Route `request` avoiding also the engines that `refused` it (a per-call UNAVAILABLE):
    when that leaves none, they may take it after all (a refusal is a moment, not a fault),
    and `refused` is cleared. The request's own exclusions (dead engines) always hold."""
    if refused:
        avoiding = msgspec.structs.replace(request, exclude=request.exclude + refused)
        reply = await router.route(avoiding, timeout)
        if reply.instance_id is not None:
            return reply
        refused.clear()
    return await router.route(request, timeout)
