"""``/v1/runs``: start a conversation, read its state, follow its events, cancel it."""

from __future__ import annotations

import re
import uuid
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Path, Query, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse

from api.http.auth import Tenant
from api.http.bodies import (
    INVALID,
    START_REFUSED,
    UNREACHABLE,
    Accepted,
    Problem,
    Responses,
    RunList,
    RunRequest,
)
from api.http.routes.paging import ListParams
from api.http.services import (
    Svc,
    network_errors,
    require_model,
    take_places,
    tool_errors,
    working_fleet,
)
from api.http.sse import run_event_stream, sse_response
from api.images.sources import tenant_image_errors
from api.state.records import ACTIVE
from api.state.runs import RunState, RunStatus
from api.state.tenant_caps import RUNS

#: How long ``POST /cancel`` waits for the run to stop before answering 202 "cancelling".
CANCEL_WAIT_S = 5.0
#: A Redis stream id (milliseconds-sequence), each part small enough for Redis to take; or
#: nothing, which means from the start.
STREAM_ID = re.compile(r"^(\d{1,19}(-\d{1,19})?)?$")

RunId = Annotated[str, Path(min_length=1, max_length=200, description="The run's id.")]
NOT_FOUND: Responses = {
    404: {
        "model": Problem,
        "description": "No such run: none has this id, it has expired, or another token "
        "started it (the answer is the same).",
    }
}

router = APIRouter(tags=["runs"], responses={**INVALID, **UNREACHABLE})


@router.post("/v1/runs", status_code=202, response_model=Accepted, responses=START_REFUSED)
async def _create_run(
    body: RunRequest, services: Svc, tenant: Tenant, response: Response
) -> Accepted:
    """Start a conversation; it runs in the background. Follow it at /v1/runs/{id}/events.
    ``options.run_id`` names a workspace of this token's own: another token's run with the same
    run_id has another workspace."""
    require_model(services)
    fleet = await working_fleet(services)
    errors = tool_errors(("options",), body.options.enable, body.options.disable, fleet)
    if services.tenants.scoped:  # a token's run: images only from where tenants may take them
        image = (("body", "options", "image"), body.options.image)
        errors += await tenant_image_errors([image], services.settings)
    scoped = tenant if services.tenants.scoped else None
    network = (("body", "options", "network"), body.options.network)
    errors += network_errors([network], services.settings, scoped)
    if body.options.limits is not None:
        over = services.settings.limits_refusal(body.options.limits, scoped)
        if over is not None:
            where = ("body", "options", "limits")
            errors.append({"loc": where, "msg": over, "type": "value_error"})
    if errors:
        raise RequestValidationError(errors)
    run_id = f"run-{uuid.uuid4().hex}"
    defaults: dict[str, Any] = {}
    if body.options.run_id is None:
        defaults["run_id"] = run_id
    if "max_turns" not in body.options.model_fields_set:
        defaults["max_turns"] = services.settings.max_turns
    options = body.options.model_copy(update=defaults)
    # Its place under the tenant's cap is taken first: a refused run leaves nothing behind.
    holding = await take_places(services, RUNS, tenant)
    try:
        await services.store.create_run(
            run_id,
            body.prompt,
            options.model_dump(mode="json"),
            services.replica,
            tenant=tenant,
            tags=body.tags,
        )
    except BaseException:
        await services.caps.give_back(holding)
        raise
    # The record keeps the run_id the caller chose; the workers know the tenant's own name of it.
    workspace = services.tenants.workspace(tenant, options.run_id or run_id)
    services.executor.submit_run(
        run_id,
        body.prompt,
        options.model_copy(update={"run_id": workspace}),
        on_end=lambda: services.caps.give_back(holding),
    )
    response.headers["Location"] = f"/v1/runs/{run_id}"
    return Accepted(id=run_id, status="queued")


@router.get("/v1/runs", response_model=RunList)
async def _list_runs(
    services: Svc,
    tenant: Tenant,
    query: ListParams,
    status: Annotated[RunStatus | None, Query(description="Only runs in this status.")] = None,
) -> RunList:
    """This token's runs, newest first, a page at a time: follow next_cursor for the next."""
    listed = await services.store.list_runs(replace(query, status=status), tenant=tenant)
    return RunList(
        runs=listed.rows, total=listed.total, limit=query.limit, next_cursor=listed.next_cursor
    )


@router.get("/v1/runs/{run_id}", response_model=RunState, responses=NOT_FOUND)
async def _get_run(run_id: RunId, services: Svc, tenant: Tenant) -> RunState:
    """A run's status, answer, usage, error and transcript."""
    state = await services.store.get_run(run_id, tenant=tenant)
    if state is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return state


@router.get(
    "/v1/runs/{run_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "The run's events so far, then live ones, then `done`.",
        },
        400: {"model": Problem, "description": "Last-Event-ID is not an event id of this API."},
        **NOT_FOUND,
    },
)
async def _run_events(
    run_id: RunId,
    services: Svc,
    tenant: Tenant,
    last_event_id: Annotated[
        str,
        Header(
            description="Resume after this event id (sent by EventSource on reconnect).",
            json_schema_extra={"pattern": STREAM_ID.pattern},
        ),
    ] = "",
) -> StreamingResponse:
    """Server-sent events: what happened so far, then live, ending with a `done` event."""
    if last_event_id and not STREAM_ID.match(last_event_id):
        raise HTTPException(400, f"Last-Event-ID {last_event_id!r} is not an event id of this API")
    state = await services.store.get_run(run_id, tenant=tenant)
    if state is None:
        raise HTTPException(404, f"no run {run_id!r}")
    after, ended = last_event_id or "0", state.status not in ACTIVE
    return sse_response(
        run_event_stream(services.store, services.event_hub, run_id, after, ended=ended)
    )


@router.post(
    "/v1/runs/{run_id}/cancel",
    response_model=Accepted,
    responses={
        202: {"model": Accepted, "description": "Asked to stop; it has not stopped yet."},
        409: {"model": Problem, "description": "The run had already ended."},
        **NOT_FOUND,
    },
)
async def _cancel_run(run_id: RunId, services: Svc, tenant: Tenant, response: Response) -> Accepted:
    """Stop a run; 200 once it has stopped, 202 if it is still stopping after a few seconds."""
    # Run ids are never reused, so a run found here is the tenant's until it expires.
    if await services.store.get_run(run_id, tenant=tenant) is None:
        raise HTTPException(404, f"no run {run_id!r}")
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
