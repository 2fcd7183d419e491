"""The routes about the service itself: its tools, metrics, schema, and its health."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError

from api.batch.items import ItemLimits
from api.http.bodies import UNREACHABLE, Health, ToolInfo
from api.http.metrics import CONTENT_TYPE
from api.http.openapi import with_fleet_tools
from api.http.services import Svc, reachable_fleet, read_queue_depths

HEALTH_TIMEOUT_S = 2.0

#: Behind the token.
router = APIRouter()
#: Open to anyone: what a load balancer or an orchestrator's probe asks.
public = APIRouter()


@router.get("/v1/tools", response_model=list[ToolInfo], tags=["fleet"], responses=UNREACHABLE)
async def _list_tools(services: Svc) -> list[ToolInfo]:
    """The fleet's tools and how many live workers serve each one's pool."""
    fleet = await reachable_fleet(services)
    return [
        ToolInfo(**spec.model_dump(), live_workers=len(fleet.workers.get(spec.pool, [])))
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
    services.metrics.set_queue_depths(await read_queue_depths(services))
    return Response(services.metrics.render(), media_type=CONTENT_TYPE)


@router.get("/openapi.json", include_in_schema=False)
async def _openapi(request: Request, services: Svc) -> JSONResponse:
    """The schema, with the tool names the fleet accepts right now."""
    fleet = await reachable_fleet(services)
    limits = ItemLimits.from_settings(services.settings)
    return JSONResponse(with_fleet_tools(request.app.openapi(), fleet, limits))


@public.get("/healthz", response_model=Health, tags=["service"])
async def _healthz(services: Svc) -> JSONResponse:
    """Liveness and readiness: 200 when this replica reaches Redis, 503 when it does not."""
    try:
        # On a connection of its own: a pool busy with requests says nothing of Redis.
        reachable = bool(await asyncio.wait_for(services.redis_probe.ping(), HEALTH_TIMEOUT_S))
    except (RedisError, OSError, TimeoutError):
        reachable = False
    body = Health(
        status="ok" if reachable else "unavailable", replica=services.replica, redis=reachable
    )
    return JSONResponse(body.model_dump(), status_code=200 if reachable else 503)
