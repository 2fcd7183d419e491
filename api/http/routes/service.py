"""The routes about the service itself: its tools, metrics, schema, and its health."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError

from api.http.bodies import Health, ToolInfo
from api.http.metrics import CONTENT_TYPE
from api.http.services import Svc, reachable_fleet

log = logging.getLogger(__name__)

QUEUE_DEPTH_TIMEOUT_S = 3.0
HEALTH_TIMEOUT_S = 2.0

#: Behind the token.
router = APIRouter()
#: Open to anyone: what a load balancer or an orchestrator's probe asks.
public = APIRouter()


@router.get("/v1/tools", response_model=list[ToolInfo], tags=["fleet"])
async def _list_tools(services: Svc) -> list[ToolInfo]:
    """The fleet's tools and how many live workers serve each one's pool."""
    fleet = await reachable_fleet(services)
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
        for spec in fleet.model_tools.values()
    ]


@router.get(
    "/metrics",
    tags=["service"],
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text."}},
)
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


@router.get("/openapi.json", include_in_schema=False)
async def _openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@public.get("/healthz", response_model=Health, tags=["service"])
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
