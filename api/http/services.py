"""What every route is given: its app's services, and the fleet checks runs and batches share:
the tools they ask for, and their ``network`` against what the operator lets runs ask for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import redis.asyncio as aioredis
from fastapi import Depends, HTTPException, Request
from redis.exceptions import RedisError

from api.calls.fleet import Fleet
from api.http.event_hub import EventHub
from api.http.metrics import ApiMetrics
from api.http.runner import RunExecutor
from api.http.tenants import Tenants
from api.settings import OrchestratorSettings
from api.state.store import ApiStore
from api.state.tenant_caps import Cap, CapReached, Holding, TenantCaps
from worker.contract.network import NetworkChoice

log = logging.getLogger(__name__)

#: How long the broker gets to say how deep its queues are.
QUEUE_DEPTH_TIMEOUT_S = 3.0


@dataclass
class Services:
    """What the routes use; one set per app."""

    settings: OrchestratorSettings
    store: ApiStore
    executor: RunExecutor
    metrics: ApiMetrics
    replica: str
    queue_depths: Callable[[OrchestratorSettings], Mapping[str, int]]
    #: Who may call, by token, and how their workspaces are named.
    tenants: Tenants
    #: Reads the live events of the runs followed in this replica, for every stream.
    event_hub: EventHub
    #: A connection of the health probe's own: no burst of requests can make it wait.
    redis_probe: aioredis.Redis
    #: How many live runs and MCP sessions each tenant may hold, counted in Redis.
    caps: TenantCaps
    #: Why this server runs no conversation (no model API configured), or None when it can.
    model_problem: str | None = None


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


#: A route's parameter of this type is given its app's services.
Svc = Annotated[Services, Depends(_services)]


async def read_queue_depths(services: Services) -> Mapping[str, int] | None:
    """Calls waiting in each pool's queue; None when the broker does not answer in time."""
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(services.queue_depths, services.settings), QUEUE_DEPTH_TIMEOUT_S
        )
    except Exception as exc:  # the broker's client raises many kinds; a reader must not fail
        log.warning("queue depths unavailable: %s", exc)
        return None


def require_model(services: Services) -> None:
    """503 when this server has no model API: it serves /mcp, the viewer and the fleet's pages,
    and starts no run or batch."""
    if services.model_problem is not None:
        raise HTTPException(503, services.model_problem)


async def reachable_fleet(services: Services) -> Fleet:
    """The fleet as the workers last published it, or 503 when it cannot be read."""
    try:
        return await services.executor.fleet()
    except (RedisError, OSError) as exc:
        raise HTTPException(503, f"the broker/result store is unreachable: {exc}") from exc


async def working_fleet(services: Services) -> Fleet:
    """The fleet, or 503 when no tools can run (no workers, or the store unreachable)."""
    fleet = await reachable_fleet(services)
    if not fleet.tools:
        raise HTTPException(
            503, "no toolq worker has published its tools: start workers (toolq worker)"
        )
    return fleet


async def take_places(services: Services, cap: Cap, tenant: str, count: int = 1) -> Holding:
    """``count`` of ``tenant``'s places under ``cap``, or 429 naming the cap and its value."""
    try:
        return await services.caps.take(cap, tenant, count)
    except CapReached as exc:
        raise HTTPException(429, str(exc)) from None


def tool_errors(
    field: tuple[str | int, ...], enable: list[str], disable: list[str], fleet: Fleet
) -> list[dict[str, Any]]:
    """Tools asked for that the fleet does not have, as validation errors."""
    errors: list[dict[str, Any]] = []
    for option, names in (("enable", enable), ("disable", disable)):
        for index, name in enumerate(names):
            offered = option == "disable" and name in fleet.model_tools  # off, whoever serves it
            if not offered and (reason := fleet.unserved(name)):
                where = ("body", *field, option, index)
                errors.append({"loc": where, "msg": reason, "type": "value_error"})
    return errors


def network_errors(
    networks: Iterable[tuple[tuple[str | int, ...], NetworkChoice]],
    settings: OrchestratorSettings,
    tenant: str | None,
    *,
    fleet: bool = True,
) -> list[dict[str, Any]]:
    """Validation errors (422, so nothing of a run asking for more is started) for each network
    asking for more than the fleet (``TOOLQ_NETWORK_ALLOWED``), or ``tenant`` (None: no tenants;
    ``TOOLQ_TENANT_NETWORK_ALLOWED``), allows; ``fleet=False``: the tenant's narrowing alone
    (where the fleet's was checked already)."""
    errors = []
    for where, network in networks:
        refused = settings.network_refusal(network, tenant, fleet=fleet)
        if refused is not None:
            errors.append({"loc": where, "msg": refused, "type": "value_error"})
    return errors
