"""The HTTP API's app: its services, its lifetime, its error answers, and its routers.

Runs and batches execute in the process that accepted them; their state and events live in
Redis under ``toolq:api:``, so any replica answers for any run, and finished results outlive a
restart. The routes are in ``api.http.routes``, a router per resource; the web viewer at ``/`` is
``api.http.viewer``; ``toolq serve`` is ``api.http.server``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from api.calls import fleet as fleet_module
from api.calls.fleet import Fleet
from api.exceptions import ModelError
from api.http.admission import StreamAdmission
from api.http.auth import BodySizeLimit, TokenGuard, require_tenant
from api.http.bodies import UNAUTHORIZED, FieldProblem, refusal
from api.http.event_hub import EventHub
from api.http.metrics import ApiMetrics
from api.http.routes import batches, runs, service
from api.http.runner import AgentExecutor, RunExecutorFactory
from api.http.services import Services
from api.http.tenants import Tenants
from api.http.viewer.routes import mount_viewer
from api.http.viewer.store import StoreSources
from api.http.viewer.tickets import StreamTickets
from api.http.viewer.viewer import Viewer
from api.model.client import ChatModel
from api.settings import OrchestratorSettings, get_settings
from api.state.redis_clients import store_client
from api.state.store import ApiStore, ReplicaLease
from api.state.tenant_caps import TenantCaps
from worker.contract.keys import DEFAULT_TENANT
from worker.contract.wire import AGENTS_QUEUE, POOLS

if TYPE_CHECKING:
    from api.mcp.http import McpEndpoint

log = logging.getLogger(__name__)


def create_app(
    settings: OrchestratorSettings | None = None,
    *,
    redis: aioredis.Redis | None = None,
    executor: RunExecutorFactory | None = None,
    model: ChatModel | None = None,
    queue_depths: Callable[[OrchestratorSettings], Mapping[str, int]] | None = None,
    tenants: Tenants | None = None,
) -> FastAPI:
    """The API app on a configured fleet (``settings`` with a broker).

    ``redis`` (the state store), ``executor`` (what runs conversations) and ``model`` default to
    the real ones from ``settings`` and OPENAI_BASE_URL / OPENAI_API_KEY; tests inject their own.
    Without a model API the app serves all the same, and refuses runs and batches (503).
    ``tenants`` default to those of ``settings``' tokens (``TokensFileError`` for a bad file).
    """
    settings = settings or get_settings()
    tenants = tenants if tenants is not None else Tenants.from_settings(settings)
    owns_redis = redis is None
    client = redis or store_client(settings.redis_url)
    store = ApiStore(client, retention_s=settings.result_ttl_s)
    metrics = ApiMetrics()
    replica = uuid.uuid4().hex[:12]
    model_problem = None
    if executor is None and model is None:
        try:
            model = ChatModel.from_env(settings)
        except ModelError as exc:
            model_problem = (
                f"no model API configured, so this server starts no run or batch: {exc}; "
                "then start toolq serve again"
            )
            log.warning("%s (/mcp, the viewer and the fleet pages work)", model_problem)
    run_executor = (
        executor(store, metrics, replica)
        if executor is not None
        else AgentExecutor(settings, store, metrics, model, replica=replica)
    )
    services = Services(
        settings,
        store,
        run_executor,
        metrics,
        replica,
        # The tool pools' queues and the agents queue.
        queue_depths or functools.partial(fleet_module.queue_depths, queues=(*POOLS, AGENTS_QUEUE)),
        tenants,
        EventHub(client),
        # One connection of the pool kept to itself: the health probe's PING never waits.
        aioredis.Redis(connection_pool=client.connection_pool, single_connection_client=True),
        TenantCaps(client, settings),
        model_problem,
    )
    lease = ReplicaLease(store, replica)
    mcp = _mcp_endpoint(settings, services.executor.fleet, services.caps)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await lease.start()
        await services.redis_probe.initialize()  # takes its connection while the pool is idle
        await services.executor.start()
        await services.caps.start()
        log.info("API replica %s serving", replica)
        try:
            async with mcp.running() if mcp is not None else contextlib.nullcontext():
                yield
        finally:
            await services.event_hub.close()
            await services.executor.close()
            await services.caps.stop()
            await lease.stop()
            await services.redis_probe.aclose()
            if owns_redis:
                await client.aclose()

    app = FastAPI(
        title="toolq",
        summary="Run LLM agents whose tool calls execute on a fleet of sandboxed workers.",
        version="0.1.0",
        lifespan=lifespan,
        openapi_url=None,  # served by the service router, behind the token
        docs_url=None,
        redoc_url=None,
    )
    app.state.services = services
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _unreadable_body)  # type: ignore[arg-type]
    app.add_exception_handler(RedisError, _store_unreachable)  # type: ignore[arg-type]
    app.add_middleware(BodySizeLimit, limit=settings.api_max_body_bytes)
    # Outermost: a stream waiting its turn has cost nothing yet.
    app.add_middleware(StreamAdmission)
    guard = [Depends(require_tenant)]
    for router in (runs.router, batches.router, service.router):
        app.include_router(router, dependencies=guard, responses=UNAUTHORIZED)
    app.include_router(service.public)
    # An ASGI app of its own, not a FastAPI route: the token guard wraps it the same way.
    app.router.routes.append(Route("/mcp", TokenGuard(mcp or _no_mcp, tenants)))
    viewers = {name: _tenant_viewer(services, name) for name in tenants.names}
    # What a shell page is rendered with: it holds data only on an API without tokens, whose
    # one tenant is the default one.
    shell = viewers.get(DEFAULT_TENANT) or next(iter(viewers.values()))
    mount_viewer(app, shell, guard, per_tenant=viewers)
    return app


def _tenant_viewer(services: Services, tenant: str) -> Viewer:
    """The viewer of one tenant's runs and batches, whose stream tickets its own token signs."""
    sources = StoreSources(services, tenant)
    token = services.tenants.tokens.get(tenant)
    return Viewer(sources, sources, sources, StreamTickets(token) if token else None)


def _mcp_endpoint(
    settings: OrchestratorSettings, fleet: Callable[[], Awaitable[Fleet]], caps: TenantCaps
) -> McpEndpoint | None:
    """The MCP server's endpoint, or None without the optional ``mcp`` package."""
    try:
        from api.mcp.http import McpEndpoint
    except ImportError:
        log.info("no MCP endpoint: the mcp package is not installed (toolq[mcp])")
        return None
    return McpEndpoint(settings, fleet, caps)


async def _no_mcp(scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse(
        {"detail": "this server has no MCP endpoint: install toolq[mcp] where it runs"}, 501
    )
    await response(scope, receive, send)


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
        errors.append(FieldProblem(field=field, where=where, message=message, type=error["type"]))
    return refusal(errors)


async def _unreadable_body(request: Request, exc: HTTPException) -> Response:
    """A body that is not UTF-8 is invalid JSON like any other, not a bare 400."""
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError):
        message = (
            f"the body is not valid JSON: it is not UTF-8 text ({cause.reason} at byte "
            f"{cause.start})"
        )
        return refusal(
            [FieldProblem(field="body", where="body", message=message, type="json_invalid")]
        )
    if exc.status_code == 405 and (allowed := _api_methods(request)):
        # Starlette names the methods of one route of the path; GET and POST /v1/runs are two.
        exc.headers = {**(exc.headers or {}), "Allow": ", ".join(allowed)}
    return await http_exception_handler(request, exc)


def _api_methods(request: Request) -> list[str]:
    """Every method the API's routes take on the request's path (none off the API)."""
    methods: set[str] = set()
    for router in (runs.router, batches.router, service.router, service.public):
        for route in router.routes:
            if isinstance(route, APIRoute) and route.matches(request.scope)[0] != Match.NONE:
                methods |= route.methods or set()
    return sorted(methods)


async def _store_unreachable(_: Request, exc: RedisError) -> JSONResponse:
    log.error("Redis failed: %s", exc)
    return JSONResponse(
        {"detail": f"the state store (Redis) is unreachable: {exc}"}, status_code=503
    )
