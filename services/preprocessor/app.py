"""The FastAPI app: everything but the generation endpoints (those are edge.py's).

GET /health, /ready, /v1/models, /v1/models/{model}, /metrics, the stored responses
(stored_responses: GET/DELETE /v1/responses/{id}, input_items, cancel) and conversations
(conversations: /v1/conversations...), POST /debug/route, which runs a request's prompt
stages and asks the router where it would go (with the request's session key, the
x-session-id header or the body's `user`), sending nothing to an engine, GET /debug/flow
(flow control: this process's view and the deployment's gate, its queue), and the admin API,
which fleet owns and this app serves over HTTP:

    GET    /admin/workers                  every configured worker: state, what was learned
    POST   /admin/workers                  add one (body: a workers-file entry, JSON)
    DELETE /admin/workers/{id}             remove one the admin API added
    POST   /admin/workers/{id}/drain       no new requests; running streams finish
    POST   /admin/workers/{id}/resume      routable again

Who may call what is edge.py's (auth.py). Errors are OpenAI-shaped here too.
"""

from __future__ import annotations

import logging

import msgspec
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from switchyard.common.fleet_admin import FleetAdminError
from switchyard.preprocessor import conversations, request_ids, stored_responses
from switchyard.preprocessor.errors import (
    INVALID_JSON,
    INVALID_REQUEST,
    NOT_FOUND,
    SERVICE_UNAVAILABLE,
    ModelNotFoundError,
    NoWorker,
    RequestError,
    as_request_error,
    error_body,
)
from switchyard.preprocessor.stages.context import CHAT, COMPLETIONS, SESSION_HEADER
from switchyard.preprocessor.stages.endpoints import new_request, prompt_stages, run_stages
from switchyard.preprocessor.state import PreprocessorState
from switchyard.preprocessor.storage.errors import StoreUnavailable
from switchyard.protos.messages import (
    FlowStatus,
    FlowStatusRequest,
    KvDebugRequest,
    RouteRequest,
    WorkerAdminReply,
    WorkerAdminRequest,
)

log = logging.getLogger(__name__)

JSON = "application/json"
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def _json(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type=JSON)


def _error(exc: BaseException) -> Response:
    err = as_request_error(exc)
    return _json(err.body(), err.status)


def create_app(state: PreprocessorState) -> FastAPI:
    app = FastAPI(title="Switchyard", lifespan=state.lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        body = error_body(str(exc.detail), INVALID_REQUEST, code)
        return Response(body, exc.status_code, exc.headers, JSON)  # a 405's Allow header

    # A route's RequestError (404, 400, 503...) is its answer; handled here, not by the
    # catch-all below (which Starlette runs as a server error, re-raised to the server).
    @app.exception_handler(RequestError)
    @app.exception_handler(StoreUnavailable)
    async def refused(request: Request, exc: Exception) -> Response:
        return _error(exc)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        return _error(exc)

    @app.get("/health")
    async def health() -> Response:
        return _json(b'{"status":"ok"}')

    @app.get("/ready")
    async def ready() -> Response:
        missing = state.not_ready_reason()
        if missing:
            return _json(error_body(missing, "service_unavailable", "not_ready"), 503)
        return _json(b'{"status":"ready"}')

    @app.get("/v1/models")
    async def models() -> Response:
        return _json(state.models_body())

    @app.get("/v1/models/{model:path}")  # ids may hold slashes: deepseek-ai/DeepSeek-V3
    async def model(model: str) -> Response:
        body = state.model_body(model)
        return _error(ModelNotFoundError(model)) if body is None else _json(body)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    stored_responses.add_routes(app, state.storage)
    conversations.add_routes(app, state.storage, state.config.store.max_bytes)

    @app.post("/debug/route")
    async def debug_route(request: Request) -> Response:
        session = request.headers.get(SESSION_HEADER)
        return await _debug_route(state, await request.body(), session)

    @app.get("/debug/kv")
    async def debug_kv(request: Request) -> Response:
        return await _debug_kv(
            state, request.query_params.get("worker"), request.query_params.get("dp_rank", "0")
        )

    @app.get("/debug/flow")
    async def debug_flow() -> Response:
        return await _debug_flow(state)

    @app.get("/admin/workers")
    async def list_workers() -> Response:
        return await _admin(state, WorkerAdminRequest(action="list"))

    @app.post("/admin/workers")
    async def add_worker(request: Request) -> Response:
        try:
            entry = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            body = error_body(f"The body is not valid JSON: {exc}", INVALID_REQUEST, INVALID_JSON)
            return _json(body, 400)
        if not isinstance(entry, str | dict) or (
            isinstance(entry, dict) and not all(isinstance(v, str) for v in entry.values())
        ):
            message = "Give the worker as a URL string or an object of strings {url, role, ...}."
            return _json(error_body(message, INVALID_REQUEST, "invalid_value"), 400)
        return await _admin(state, WorkerAdminRequest(action="add", entry=entry))

    @app.delete("/admin/workers/{worker}")
    async def remove_worker(worker: str) -> Response:
        return await _admin(state, WorkerAdminRequest(action="remove", worker=worker))

    @app.post("/admin/workers/{worker}/drain")
    async def drain_worker(worker: str) -> Response:
        return await _admin(state, WorkerAdminRequest(action="drain", worker=worker))

    @app.post("/admin/workers/{worker}/resume")
    async def resume_worker(worker: str) -> Response:
        return await _admin(state, WorkerAdminRequest(action="resume", worker=worker))

    return app


_ADMIN_CODES = {400: (INVALID_REQUEST, "invalid_value"), 404: (NOT_FOUND, "worker_not_found")}


async def _admin(state: PreprocessorState, request: WorkerAdminRequest) -> Response:
    try:
        reply: WorkerAdminReply = await state.admin(request)
    except FleetAdminError as exc:
        body = error_body(f"Fleet did not answer: {exc}", SERVICE_UNAVAILABLE, "fleet_unavailable")
        return _json(body, 503)
    if reply.status >= 400:
        kind, code = _ADMIN_CODES.get(reply.status, (INVALID_REQUEST, "conflict"))
        return _json(error_body(reply.message, kind, code), reply.status)
    workers = [msgspec.structs.asdict(w) for w in reply.workers]
    if request.action == "list":
        return _json(orjson.dumps({"object": "list", "data": workers}))
    payload = {"message": reply.message, "worker": workers[0] if workers else None}
    return _json(orjson.dumps(payload), reply.status)


class _NoAnswer:
    """/debug/route runs the prompt stages only: they never answer."""

    async def start_stream(self) -> None:
        raise RuntimeError("no answer")

    async def write(self, data: bytes) -> None:
        raise RuntimeError("no answer")

    async def end_stream(self, data: bytes = b"") -> None:
        raise RuntimeError("no answer")

    async def respond(self, status: int, body: bytes, extra: object = None) -> None:
        raise RuntimeError("no answer")


async def _debug_route(
    state: PreprocessorState, body: bytes, session_id: str | None = None
) -> Response:
    """Where would this request go, and why? Decided by the router, sent to no engine."""
    endpoint = CHAT if b'"messages"' in body else COMPLETIONS
    ctx = new_request(state.deps, endpoint, _NoAnswer(), session_id=session_id)
    ctx.raw = body
    try:
        await run_stages(ctx, prompt_stages(endpoint))
        model = ctx.request.model
        prompt_ids = ctx.prompt_ids[0]
        reply = await state.router.route(
            RouteRequest(
                request_id=f"route-{ctx.inp.request_id}",
                model=model,
                token_ids=prompt_ids,
                dry_run=True,
                session_id=ctx.session_id,
                requires=list(ctx.requires),
            ),
            state.config.route_timeout,
        )
        if reply.instance_id is None:
            raise NoWorker(reply.error, f"no engine for {model!r}", model)
    except (RequestError, NoWorker) as exc:
        return _error(exc)
    workers = sorted(reply.workers, key=lambda w: (w.cost, w.instance_id))
    chosen_instance = state.fleet.instances.get(reply.instance_id)
    return _json(
        orjson.dumps(
            {
                "policy": reply.policy,
                "requires": list(ctx.requires),
                "prompt_tokens": len(prompt_ids),
                "prompt_blocks": reply.prompt_blocks,
                "chosen": {
                    "instance_id": reply.instance_id,
                    "url": chosen_instance.url if chosen_instance else None,
                    "dp_rank": reply.dp_rank,
                    "predicted_ttft_ms": reply.predicted_ttft_ms,
                },
                "prefill": _instance_ref(state, reply.prefill_instance_id),
                "workers": [msgspec.structs.asdict(w) for w in workers],
            }
        )
    )


async def _debug_kv(state: PreprocessorState, worker: str | None, rank: str) -> Response:
    """The router's view of the engines' KV caches: every worker's event stream, or (with
    `worker`, a URL or instance id) one worker's index summary. Asked of one router."""
    instance_id: int | None = None
    if worker is not None:
        found = [
            i.instance_id
            for i in state.fleet.instances.values()
            if i.url == worker or str(i.instance_id) == worker
        ]
        if not found:
            body = error_body(f"No worker {worker!r} is routable.", NOT_FOUND, "worker_not_found")
            return _json(body, 404)
        instance_id = found[0]
    if not rank.isdigit():
        message = f"dp_rank must be a whole number, got {rank!r}"
        return _json(error_body(message, INVALID_REQUEST, "invalid_value"), 400)
    request = KvDebugRequest(
        request_id=request_ids.mint("kv-debug-"), instance_id=instance_id, dp_rank=int(rank)
    )
    reply = await state.router.kv_debug(request, state.config.route_timeout)
    if reply is None:
        body = error_body("No router answered.", SERVICE_UNAVAILABLE, "router_unavailable")
        return _json(body, 503)
    if not reply.found:
        body = error_body(
            f"The router has no KV view of {worker!r}.", NOT_FOUND, "worker_not_found"
        )
        return _json(body, 404)
    return _json(orjson.dumps(reply.body))


async def _debug_flow(state: PreprocessorState) -> Response:
    """Flow control as this process sees it, and the deployment's gate (the leading
    router's queue, its bands and flows)."""
    flow = state.flow
    if flow is None:
        return _json(orjson.dumps({"flow_control": False}))
    gate = None
    leader = state.router.flow_leader()
    if leader is not None:
        key = request_ids.mint("flow-status-")
        try:
            reply = await leader.call(
                key, FlowStatusRequest(request_id=key), state.config.route_timeout
            )
        except (TimeoutError, ConnectionError):
            reply = None
        if isinstance(reply, FlowStatus):
            gate = {"router": leader.endpoint, "state": reply.state}
    return _json(
        orjson.dumps(
            {
                "flow_control": True,
                "config": {
                    "digest": flow.config.digest,
                    "max_running": flow.config.max_running,
                    "burst": flow.config.burst,
                    "max_queued": flow.config.max_queued,
                    "queue_timeout_s": flow.config.queue_timeout_s,
                },
                "preprocessor": flow.status(),
                "deployment": gate,
            }
        )
    )


def _instance_ref(state: PreprocessorState, instance_id: int | None) -> dict | None:
    if instance_id is None:
        return None
    instance = state.fleet.instances.get(instance_id)
    return {"instance_id": instance_id, "url": instance.url if instance else None}
