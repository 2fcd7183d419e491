"""``/v1/batches``: start many conversations at once, read their progress and results."""

from __future__ import annotations

import functools
import uuid
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api.batch.items import ItemLimits
from api.http.auth import Tenant
from api.http.bodies import (
    ID_CONFLICT,
    INVALID,
    START_REFUSED,
    UNREACHABLE,
    Accepted,
    BatchList,
    BatchRequest,
    Problem,
    refusal,
)
from api.http.routes.paging import ListParams
from api.http.runner import BatchSubmission
from api.http.services import (
    Svc,
    network_errors,
    require_model,
    take_places,
    tool_errors,
    working_fleet,
)
from api.images.sources import tenant_image_errors
from api.state.batches import BatchState, BatchStatus, BatchSummary
from api.state.tenant_caps import RUNS

#: Past any batch's results, and within what Redis takes as a list index.
MAX_OFFSET = 1_000_000_000

router = APIRouter(tags=["batches"], responses={**INVALID, **UNREACHABLE})


@router.post(
    "/v1/batches",
    status_code=202,
    response_model=Accepted,
    responses={**START_REFUSED, **ID_CONFLICT},
)
async def _create_batch(
    body: BatchRequest, services: Svc, tenant: Tenant, response: Response
) -> Accepted | JSONResponse:
    """Start many conversations or tasks (the items of ``toolq batch``); progress and results at
    /v1/batches/{id}."""
    conflicts = body.id_conflicts()
    if conflicts:
        return refusal(conflicts, 409)
    require_model(services)
    fleet = await working_fleet(services)
    limits = ItemLimits.from_settings(services.settings)
    errors = [
        error
        for index, item in enumerate(body.items)
        for error in tool_errors(("items", index), item.enable, [], fleet)
    ]
    errors += [
        {"loc": ("body", "items", index, name), "msg": problem, "type": "value_error"}
        for index, item in enumerate(body.items)
        for name, problem in limits.problems(item)
    ]
    if services.tenants.scoped:
        # A token's runs: images only from where tenants may take them; the tenant's own network
        # and limits (the fleet's TOOLQ_NETWORK_ALLOWED and maximums are among the limits above).
        settings = services.settings
        images = [(("body", "items", i, "image"), item.image) for i, item in enumerate(body.items)]
        errors += await tenant_image_errors(images, settings)
        networks = [
            (("body", "items", i, "network"), it.network) for i, it in enumerate(body.items)
        ]
        errors += network_errors(networks, settings, tenant, fleet=False)
        errors += [
            {"loc": ("body", "items", index, "limits"), "msg": over, "type": "value_error"}
            for index, item in enumerate(body.items)
            if item.limits is not None
            and settings.limits_max.refusal(item.limits, settings.max_timeout_ms) is None
            and (over := settings.limits_refusal(item.limits, tenant)) is not None
        ]
    if errors:
        raise RequestValidationError(errors)
    batch_id = f"batch-{uuid.uuid4().hex}"
    # A live run under the tenant's cap for each conversation the batch runs at once.
    holding = await take_places(services, RUNS, tenant, min(body.concurrency, len(body.items)))
    try:
        await services.store.create_batch(
            batch_id,
            total=len(body.items),
            concurrency=body.concurrency,
            replica=services.replica,
            tenant=tenant,
            tags=body.tags,
        )
    except BaseException:
        await services.caps.give_back(holding)
        raise
    services.executor.submit_batch(
        BatchSubmission(
            batch_id,
            body.items,
            body.concurrency,
            body.model,
            workspace_of=functools.partial(services.tenants.workspace, tenant),
            on_end=lambda: services.caps.give_back(holding),
        )
    )
    response.headers["Location"] = f"/v1/batches/{batch_id}"
    return Accepted(id=batch_id, status="queued")


@router.get("/v1/batches", response_model=BatchList)
async def _list_batches(
    services: Svc,
    tenant: Tenant,
    query: ListParams,
    status: Annotated[BatchStatus | None, Query(description="Only batches in this status.")] = None,
) -> BatchList:
    """This token's batches, newest first, a page at a time: follow next_cursor for the next."""
    listed = await services.store.list_batches(replace(query, status=status), tenant=tenant)
    summaries = [
        BatchSummary.model_validate(batch.state.model_dump(exclude={"offset", "limit", "results"}))
        for batch in listed.rows
    ]
    return BatchList(
        batches=summaries, total=listed.total, limit=query.limit, next_cursor=listed.next_cursor
    )


@router.get(
    "/v1/batches/{batch_id}",
    response_model=BatchState,
    responses={
        404: {
            "model": Problem,
            "description": "No such batch: none has this id, it has expired, or another token "
            "started it (the answer is the same).",
        }
    },
)
async def _get_batch(
    batch_id: Annotated[str, Path(min_length=1, max_length=200)],
    services: Svc,
    tenant: Tenant,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="First result to return.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="Results per page.")] = 100,
) -> BatchState:
    """Progress (total, done, ok, error, running) and a page of output records, in the order
    they finished."""
    state = await services.store.get_batch(batch_id, offset=offset, limit=limit, tenant=tenant)
    if state is None:
        raise HTTPException(404, f"no batch {batch_id!r}")
    return state
