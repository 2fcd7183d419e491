"""The HTTP API (``toolq serve``): runs, their live events, batches, tools, health, metrics.

Runs and batches execute in the process that accepted them; their state and events live in
Redis under ``toolq:api:``, so any replica answers for any run, and finished results outlive a
restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Annotated, Any, NoReturn

import redis.asyncio as aioredis
import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from redis.exceptions import RedisError

from api import fleet as fleet_module
from api.agent import AgentOptions
from api.batch.items import BatchItem
from api.fleet import Fleet
from api.http.auth import BodySizeLimit, is_loopback, token_guard
from api.http.metrics import CONTENT_TYPE, ApiMetrics
from api.http.runner import AgentExecutor, Executor, ExecutorFactory
from api.http.state import ACTIVE, DONE, ApiStore, BatchState, ReplicaLease, RunState
from api.llm import ChatModel, ModelError
from api.local.stack import LocalStackError, fleet_for
from api.settings import OrchestratorSettings, get_settings

log = logging.getLogger(__name__)

#: How long ``POST /cancel`` waits for the run to stop before answering 202 "cancelling".
CANCEL_WAIT_S = 5.0
#: An SSE stream sends a comment this often while nothing happens (and checks the run is alive).
SSE_IDLE_S = 5.0
QUEUE_DEPTH_TIMEOUT_S = 3.0
HEALTH_TIMEOUT_S = 2.0
STREAM_ID = re.compile(r"^\d+(-\d+)?$")


# --- Bodies --------------------------------------------------------------------------------------


class RunRequest(BaseModel):
    """A conversation to run: the user's message and the agent's options."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, description="The user's message.")
    options: AgentOptions = Field(
        default_factory=AgentOptions,
        description="Agent options; options.run_id names the workspace (default: the run's id).",
    )


class BatchRequest(BaseModel):
    """Many conversations, run ``concurrency`` at a time."""

    model_config = ConfigDict(extra="forbid")

    items: list[BatchItem] = Field(min_length=1)
    concurrency: int = Field(10, ge=1, le=1000, description="Conversations in flight at once.")
    model: str | None = Field(None, description="Model for items without one (TOOLQ_MODEL).")

    @model_validator(mode="after")
    def _unique_ids(self) -> BatchRequest:
        seen: set[str] = set()
        for item in self.items:
            if item.id in seen:
                raise ValueError(f"duplicate item id {item.id!r}: ids name the results")
            seen.add(item.id)
        return self


class Accepted(BaseModel):
    id: str
    status: str


class ToolInfo(BaseModel):
    name: str
    pool: str
    description: str
    parameters: dict[str, Any]
    enabled_by_default: bool
    idempotent: bool
    live_workers: int = Field(description="Workers of the tool's pool alive right now.")


class Problem(BaseModel):
    detail: str


class Health(BaseModel):
    status: str
    replica: str
    redis: bool


# --- Wiring --------------------------------------------------------------------------------------


@dataclass
class Services:
    """What the routes use; one set per app."""

    settings: OrchestratorSettings
    store: ApiStore
    executor: Executor
    metrics: ApiMetrics
    replica: str
    queue_depths: Callable[[OrchestratorSettings], Mapping[str, int]]


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


Svc = Annotated[Services, Depends(_services)]


def create_app(
    settings: OrchestratorSettings | None = None,
    *,
    redis: aioredis.Redis | None = None,
    executor: ExecutorFactory | None = None,
    model: ChatModel | None = None,
    queue_depths: Callable[[OrchestratorSettings], Mapping[str, int]] = fleet_module.queue_depths,
    lease_ttl_s: float = 15.0,
) -> FastAPI:
    """The API app on a configured fleet (``settings`` with a broker).

    ``redis`` (the state store), ``executor`` (what runs conversations) and ``model`` default to
    the real ones from ``settings`` and OPENAI_BASE_URL / OPENAI_API_KEY; tests inject their own.
    """
    settings = settings or get_settings()
    owns_redis = redis is None
    client = redis or aioredis.Redis.from_url(settings.redis_url, health_check_interval=30)
    store = ApiStore(client, retention_s=settings.result_ttl_s, lease_ttl_s=lease_ttl_s)
    metrics = ApiMetrics()
    replica = uuid.uuid4().hex[:12]
    make_executor = executor or _agent_executor(settings, model or ChatModel.from_env(settings))
    services = Services(
        settings, store, make_executor(store, metrics, replica), metrics, replica, queue_depths
    )
    lease = ReplicaLease(store, replica)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await lease.start()
        await services.executor.start()
        log.info("API replica %s serving", replica)
        try:
            yield
        finally:
            await services.executor.close()
            await lease.stop()
            if owns_redis:
                await client.aclose()

    app = FastAPI(
        title="toolq",
        summary="Run LLM agents whose tool calls execute on a fleet of sandboxed workers.",
        version="0.1.0",
        lifespan=lifespan,
        openapi_url=None,  # served below, behind the token
        docs_url=None,
        redoc_url=None,
    )
    app.state.services = services
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(RedisError, _store_unreachable)  # type: ignore[arg-type]
    app.add_middleware(BodySizeLimit, limit=settings.api_max_body_bytes)
    guarded = APIRouter(
        dependencies=[Depends(token_guard(settings.api_token))],
        responses={401: {"model": Problem, "description": "Missing or wrong bearer token."}},
    )
    _add_run_routes(guarded)
    _add_batch_routes(guarded)
    _add_service_routes(guarded)
    app.include_router(guarded)
    app.add_api_route(
        "/healthz", _healthz, methods=["GET"], response_model=Health, tags=["service"]
    )
    return app


def _agent_executor(settings: OrchestratorSettings, model: ChatModel) -> ExecutorFactory:
    def make(store: ApiStore, metrics: ApiMetrics, replica: str) -> Executor:
        return AgentExecutor(settings, store, metrics, model, replica=replica)

    return make


# --- Errors --------------------------------------------------------------------------------------


async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each field and what is wrong with it, without echoing the input back."""
    errors = []
    for error in exc.errors():
        location = [str(part) for part in error["loc"]]
        where = location[0] if location else "body"
        field = ".".join(location[1:]) if len(location) > 1 else where
        message = str(error["msg"])
        if error["type"] == "json_invalid":
            field = "body"
            reason = (error.get("ctx") or {}).get("error", "")
            message = f"the body is not valid JSON: {reason} at position {location[-1]}"
        errors.append({"field": field, "in": where, "message": message, "type": error["type"]})
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return JSONResponse({"detail": summary, "errors": errors}, status_code=422)


async def _store_unreachable(_: Request, exc: RedisError) -> JSONResponse:
    log.error("Redis failed: %s", exc)
    return JSONResponse(
        {"detail": f"the state store (Redis) is unreachable: {exc}"}, status_code=503
    )


def _tool_errors(
    field: tuple[str | int, ...], enable: list[str], disable: list[str], fleet: Fleet
) -> list[dict[str, Any]]:
    """Tools asked for that the fleet does not have, as validation errors."""
    errors: list[dict[str, Any]] = []
    known = ", ".join(fleet.tools) or "none"
    for index, name in enumerate(enable):
        if name not in fleet.tools:
            msg = f"no worker serves a tool named {name!r} (tools: {known})"
        elif not fleet.serves(name):
            msg = f"no live worker serves the {fleet.tools[name].pool!r} pool of {name!r}"
        else:
            continue
        errors.append({"loc": ("body", *field, "enable", index), "msg": msg, "type": "value_error"})
    for index, name in enumerate(disable):
        if name not in fleet.tools:
            msg = f"no worker serves a tool named {name!r} (tools: {known})"
            errors.append(
                {"loc": ("body", *field, "disable", index), "msg": msg, "type": "value_error"}
            )
    return errors


async def _working_fleet(services: Services) -> Fleet:
    """The fleet, or 503 when no tools can run (no workers, or the store unreachable)."""
    try:
        fleet = await services.executor.fleet()
    except (RedisError, OSError) as exc:
        raise HTTPException(503, f"the broker/result store is unreachable: {exc}") from exc
    if not fleet.tools:
        raise HTTPException(
            503, "no toolq worker has published its tools: start workers (toolq worker)"
        )
    return fleet


# --- Runs ----------------------------------------------------------------------------------------

RunId = Annotated[str, Path(min_length=1, max_length=200, description="The run's id.")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "No such run."}
}


def _add_run_routes(router: APIRouter) -> None:
    router.add_api_route(
        "/v1/runs",
        _create_run,
        methods=["POST"],
        status_code=202,
        response_model=Accepted,
        tags=["runs"],
        responses={
            413: {"model": Problem, "description": "The body is over the size limit."},
            503: {"model": Problem, "description": "No workers, or Redis unreachable."},
        },
    )
    router.add_api_route(
        "/v1/runs/{run_id}",
        _get_run,
        methods=["GET"],
        response_model=RunState,
        tags=["runs"],
        responses=NOT_FOUND,
    )
    router.add_api_route(
        "/v1/runs/{run_id}/events",
        _run_events,
        methods=["GET"],
        tags=["runs"],
        response_class=StreamingResponse,
        responses={
            200: {
                "content": {"text/event-stream": {}},
                "description": "The run's events so far, then live ones, then `done`.",
            },
            **NOT_FOUND,
        },
    )
    router.add_api_route(
        "/v1/runs/{run_id}/cancel",
        _cancel_run,
        methods=["POST"],
        response_model=Accepted,
        tags=["runs"],
        responses={
            202: {"model": Accepted, "description": "Asked to stop; it has not stopped yet."},
            409: {"model": Problem, "description": "The run had already ended."},
            **NOT_FOUND,
        },
    )


async def _create_run(body: RunRequest, services: Svc, response: Response) -> Accepted:
    """Start a conversation; it runs in the background. Follow it at /v1/runs/{id}/events."""
    fleet = await _working_fleet(services)
    errors = _tool_errors(("options",), body.options.enable, body.options.disable, fleet)
    if errors:
        raise RequestValidationError(errors)
    run_id = f"run-{uuid.uuid4().hex}"
    defaults: dict[str, Any] = {}
    if body.options.run_id is None:
        defaults["run_id"] = run_id
    if "max_turns" not in body.options.model_fields_set:
        defaults["max_turns"] = services.settings.max_turns
    options = body.options.model_copy(update=defaults)
    await services.store.create_run(
        run_id, body.prompt, options.model_dump(mode="json"), services.replica
    )
    services.executor.submit_run(run_id, body.prompt, options)
    response.headers["Location"] = f"/v1/runs/{run_id}"
    return Accepted(id=run_id, status="queued")


async def _get_run(run_id: RunId, services: Svc) -> RunState:
    """A run's status, answer, usage, error and transcript."""
    state = await services.store.get_run(run_id)
    if state is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return state


async def _run_events(
    run_id: RunId,
    services: Svc,
    last_event_id: Annotated[
        str | None,
        Header(description="Resume after this event id (sent by EventSource on reconnect)."),
    ] = None,
) -> StreamingResponse:
    """Server-sent events: what happened so far, then live, ending with a `done` event."""
    if last_event_id is not None and not STREAM_ID.match(last_event_id):
        raise HTTPException(400, f"Last-Event-ID {last_event_id!r} is not an event id of this API")
    if await services.store.get_run(run_id) is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return StreamingResponse(
        _event_stream(services, run_id, last_event_id or "0"),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _event_stream(services: Services, run_id: str, after: str) -> AsyncIterator[bytes]:
    store = services.store
    ended_before = False
    while True:
        entries = await store.read_events(run_id, after, block_ms=int(SSE_IDLE_S * 1000))
        for entry_id, event in entries:
            after = entry_id
            yield _sse(entry_id, event)
            if event.get("type") == DONE:
                return
        if entries:
            continue
        # Quiet: is the run still going? Reading it also fails a run whose replica died.
        state = await store.get_run(run_id)
        if state is None or (state.status not in ACTIVE and ended_before):
            # Its events expired (or were trimmed) before its end was read: say how it ended.
            status = state.status if state else "unknown"
            error = state.error if state else "the run's record has expired"
            yield _sse("0", {"type": DONE, "status": status, "error": error, "stop_reason": None})
            return
        ended_before = state.status not in ACTIVE
        yield b": keep-alive\n\n"


def _sse(entry_id: str, event: Mapping[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"))
    return f"id: {entry_id}\nevent: {event.get('type', 'message')}\ndata: {data}\n\n".encode()


async def _cancel_run(run_id: RunId, services: Svc, response: Response) -> Accepted:
    """Stop a run; 200 once it has stopped, 202 if it is still stopping after a few seconds."""
    outcome = await services.store.request_cancel(run_id)
    if outcome is None:
        raise HTTPException(404, f"no run {run_id!r}")
    if outcome == "cancelled_now":
        services.metrics.record_run("cancelled")
        return Accepted(id=run_id, status="cancelled")
    if outcome != "cancelling":
        raise HTTPException(409, f"run {run_id!r} has already ended: {outcome}")
    state = await services.store.wait_until_ended(run_id, CANCEL_WAIT_S)
    if state is None or state.status in ACTIVE:
        response.status_code = 202
        return Accepted(id=run_id, status="cancelling")
    if state.status != "cancelled":
        raise HTTPException(409, f"run {run_id!r} ended ({state.status}) before it could stop")
    return Accepted(id=run_id, status="cancelled")


# --- Batches -------------------------------------------------------------------------------------


def _add_batch_routes(router: APIRouter) -> None:
    router.add_api_route(
        "/v1/batches",
        _create_batch,
        methods=["POST"],
        status_code=202,
        response_model=Accepted,
        tags=["batches"],
        responses={
            413: {"model": Problem, "description": "The body is over the size limit."},
            503: {"model": Problem, "description": "No workers, or Redis unreachable."},
        },
    )
    router.add_api_route(
        "/v1/batches/{batch_id}",
        _get_batch,
        methods=["GET"],
        response_model=BatchState,
        tags=["batches"],
        responses={404: {"model": Problem, "description": "No such batch."}},
    )


async def _create_batch(body: BatchRequest, services: Svc, response: Response) -> Accepted:
    """Start many conversations; progress and results at /v1/batches/{id}."""
    fleet = await _working_fleet(services)
    errors = [
        error
        for index, item in enumerate(body.items)
        for error in _tool_errors(("items", index), item.enable, [], fleet)
    ]
    if errors:
        raise RequestValidationError(errors)
    batch_id = f"batch-{uuid.uuid4().hex}"
    await services.store.create_batch(
        batch_id, total=len(body.items), concurrency=body.concurrency, replica=services.replica
    )
    services.executor.submit_batch(batch_id, body.items, body.concurrency, body.model)
    response.headers["Location"] = f"/v1/batches/{batch_id}"
    return Accepted(id=batch_id, status="queued")


async def _get_batch(
    batch_id: Annotated[str, Path(min_length=1, max_length=200)],
    services: Svc,
    offset: Annotated[int, Query(ge=0, description="First result to return.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="Results per page.")] = 100,
) -> BatchState:
    """Progress (total, done, ok, error, running) and a page of output records, in the order
    they finished."""
    state = await services.store.get_batch(batch_id, offset=offset, limit=limit)
    if state is None:
        raise HTTPException(404, f"no batch {batch_id!r}")
    return state


# --- Service -------------------------------------------------------------------------------------


def _add_service_routes(router: APIRouter) -> None:
    router.add_api_route(
        "/v1/tools", _list_tools, methods=["GET"], response_model=list[ToolInfo], tags=["fleet"]
    )
    router.add_api_route(
        "/metrics",
        _metrics,
        methods=["GET"],
        tags=["service"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text."}},
    )
    router.add_api_route("/openapi.json", _openapi, methods=["GET"], include_in_schema=False)


async def _list_tools(services: Svc) -> list[ToolInfo]:
    """The fleet's tools and how many live workers serve each one's pool."""
    try:
        fleet = await services.executor.fleet()
    except (RedisError, OSError) as exc:
        raise HTTPException(503, f"the broker/result store is unreachable: {exc}") from exc
    return [
        ToolInfo(
            name=spec.name,
            pool=spec.pool,
            description=spec.description,
            parameters=spec.parameters,
            enabled_by_default=spec.enabled_by_default,
            idempotent=spec.idempotent,
            live_workers=len(fleet.workers.get(spec.pool, [])),
        )
        for spec in fleet.tools.values()
    ]


async def _metrics(services: Svc) -> Response:
    """Prometheus metrics of this replica, and the queue depths of the fleet."""
    try:
        depths: Mapping[str, int] | None = await asyncio.wait_for(
            asyncio.to_thread(services.queue_depths, services.settings), QUEUE_DEPTH_TIMEOUT_S
        )
    except Exception as exc:  # the broker's client raises many kinds; the scrape must not fail
        log.warning("queue depths unavailable: %s", exc)
        depths = None
    services.metrics.set_queue_depths(depths)
    return Response(services.metrics.render(), media_type=CONTENT_TYPE)


async def _openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


async def _healthz(services: Svc) -> JSONResponse:
    """Liveness and readiness: 200 when this replica reaches Redis, 503 when it does not."""
    try:
        reachable = bool(await asyncio.wait_for(services.store.redis.ping(), HEALTH_TIMEOUT_S))
    except (RedisError, OSError, TimeoutError):
        reachable = False
    body = Health(
        status="ok" if reachable else "unavailable", replica=services.replica, redis=reachable
    )
    return JSONResponse(body.model_dump(), status_code=200 if reachable else 503)


# --- Serving -------------------------------------------------------------------------------------


def serve(host: str, port: int, *, settings: OrchestratorSettings | None = None) -> None:
    """Serve the API until interrupted. Without a broker (local mode) a private Redis and one
    worker per pool run for the server's lifetime."""
    from api.logs import configure_logging

    settings = settings or get_settings()
    try:
        settings.redis_url  # noqa: B018 - an amqp broker needs TOOLQ_RESULT_BACKEND
    except ValueError as exc:
        _refuse(str(exc))
    if not settings.api_token and not is_loopback(host):
        _refuse(
            f"refusing to listen on {host} without TOOLQ_API_TOKEN: anyone who can reach it "
            "could run agents and tools. Set TOOLQ_API_TOKEN, or listen on 127.0.0.1."
        )
    configure_logging(settings)
    try:
        model = ChatModel.from_env(settings)
    except ModelError as exc:
        _refuse(f"no model API configured: {exc}")
    if settings.local_mode:
        log.info("no TOOLQ_BROKER_URL: starting a local Redis and workers for this server")
    # uvicorn re-raises the signal that stopped it once it has shut down; as an exception it
    # unwinds through fleet_for, which stops the local stack instead of leaving it orphaned.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, _exit_cleanly)
    try:
        with fleet_for(settings) as fleet_settings:
            app = create_app(fleet_settings, model=model)
            config = uvicorn.Config(
                app, host=host, port=port, log_config=None, timeout_graceful_shutdown=5
            )
            uvicorn.Server(config).run()
    except LocalStackError as exc:
        print(f"error: the local stack did not start: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


def _exit_cleanly(signum: int, _: FrameType | None) -> None:
    raise SystemExit(0)


def _refuse(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
