"""The viewer's routes: shell pages (open: they hold no data), page contents (behind the token),
live streams (behind a ticket), and the static script and style.

Every page has two addresses: ``/batches/{id}`` is what a browser opens and shows in its address
bar; ``/ui/page/batches/{id}`` is its content, which the script fetches with the token. A viewer
with no token to ask for (``toolq view``, or a server on loopback without one) puts the content
in the shell at once, so its pages work without the script too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Annotated

from fastapi import APIRouter, FastAPI, Header, HTTPException, Query, Request
from fastapi.params import Depends
from fastapi.responses import StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.responses import Response

from api.http.sse import KEEP_ALIVE, sse_response
from api.http.viewer import pages
from api.http.viewer.viewer import STATIC_DIR, Page, Viewer, render, templates
from api.state.records import ACTIVE

#: How often a live batch page's stream looks for new results.
BATCH_POLL_S = 1.0
#: A quiet stream sends a comment this often, so proxies keep it open.
KEEP_ALIVE_S = 15.0

PageMaker = Callable[[Viewer, Request], Awaitable[Page]]


def _viewer(request: Request) -> Viewer:
    """The viewer of the tenant the token guard let in (``request.state.tenant``); where no
    guard ran (shells, streams), the app's own."""
    tenant: str | None = getattr(request.state, "tenant", None)
    if tenant is not None:
        per_tenant: Mapping[str, Viewer] = request.app.state.tenant_viewers
        return per_tenant[tenant]
    viewer: Viewer = request.app.state.viewer
    return viewer


def _home(viewer: Viewer, request: Request) -> Awaitable[Page]:
    if viewer.single_batch is not None:  # a results file: its one batch
        return pages.batch_page(viewer, viewer.single_batch, request.query_params)
    return pages.batches_page(viewer, request.query_params)


#: Each page: its path under ``/`` (the shell) and under ``/ui/page`` (its content).
PAGES: dict[str, PageMaker] = {
    "/": _home,
    "/batches": lambda viewer, request: pages.batches_page(viewer, request.query_params),
    "/batches/{batch_id}": lambda viewer, request: pages.batch_page(
        viewer, request.path_params["batch_id"], request.query_params
    ),
    "/batches/{batch_id}/items/{number:int}": lambda viewer, request: pages.item_page(
        viewer,
        request.path_params["batch_id"],
        request.path_params["number"],
        request.query_params,
    ),
    "/runs": lambda viewer, request: pages.runs_page(viewer, request.query_params),
    "/runs/{run_id}": lambda viewer, request: pages.run_page(viewer, request.path_params["run_id"]),
    "/fleet": lambda viewer, _: pages.fleet_page(viewer),
}


def mount_viewer(
    app: FastAPI,
    viewer: Viewer,
    guard: list[Depends],
    *,
    per_tenant: Mapping[str, Viewer] | None = None,
) -> None:
    """Serve ``viewer`` on ``app``: shells and streams open, page contents behind ``guard``.

    With ``per_tenant`` (tenant -> its viewer), a page's content is its tenant's viewer's, the
    tenant being the one ``guard`` let in; ``viewer`` renders the shells.
    """
    app.state.viewer = viewer
    app.state.tenant_viewers = per_tenant or {}
    jinja = templates()
    shells = APIRouter(include_in_schema=False)
    contents = APIRouter(include_in_schema=False, dependencies=guard)
    for path, make in PAGES.items():
        shells.add_api_route(path, _page_route(jinja, make, in_shell=True), methods=["GET"])
        content = "/ui/page" + path if path != "/" else "/ui/page/"
        contents.add_api_route(content, _page_route(jinja, make, in_shell=False), methods=["GET"])
    streams = APIRouter(include_in_schema=False)
    streams.add_api_route("/ui/live/runs/{run_id}", _run_stream, methods=["GET"])
    streams.add_api_route("/ui/live/batches/{batch_id}", _batch_stream, methods=["GET"])
    app.include_router(shells)
    app.include_router(contents)
    app.include_router(streams)
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="viewer-static")


def _page_route(
    jinja: Jinja2Templates, make: PageMaker, *, in_shell: bool
) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        viewer = _viewer(request)
        if in_shell and viewer.needs_token:  # the content comes with the token, fetched
            return render(request, jinja, viewer, Page("", "toolq"), in_shell=True)
        return render(request, jinja, viewer, await make(viewer, request), in_shell=in_shell)

    return route


def _check_ticket(request: Request, ticket: str | None) -> Viewer:
    """The viewer whose tickets admit this stream: each tenant's are signed with its own token,
    and given only with a page of its own runs and batches."""
    viewer = _viewer(request)
    if viewer.tickets is None:
        return viewer
    per_tenant: Mapping[str, Viewer] = request.app.state.tenant_viewers
    for candidate in per_tenant.values() or [viewer]:
        if candidate.tickets is not None and candidate.tickets.admits(request.url.path, ticket):
            return candidate
    raise HTTPException(401, "this stream needs a ticket from a page fetched with the token")


async def _run_stream(
    request: Request,
    run_id: str,
    ticket: Annotated[str | None, Query()] = None,
    after: Annotated[str, Query(pattern=r"^\d{1,19}(-\d{1,19})?$")] = "0",
    last_event_id: Annotated[str | None, Header(pattern=r"^\d{1,19}(-\d{1,19})?$")] = None,
) -> StreamingResponse:
    """A run's events after ``after`` (or after Last-Event-ID, when the browser reconnects)."""
    viewer = _check_ticket(request, ticket)
    run = await viewer.runs.run(run_id) if viewer.runs else None
    if viewer.runs is None or run is None:
        raise HTTPException(404, f"no run {run_id!r}")
    ended = run.status not in ACTIVE
    return sse_response(viewer.runs.stream(run_id, last_event_id or after, ended=ended))


async def _batch_stream(
    request: Request, batch_id: str, ticket: Annotated[str | None, Query()] = None
) -> StreamingResponse:
    """A ``progress`` event each time a batch's numbers change, ``done`` once they no longer
    can."""
    viewer = _check_ticket(request, ticket)
    if await viewer.batches.batch(batch_id) is None:
        raise HTTPException(404, f"no batch {batch_id!r}")
    return sse_response(_batch_events(viewer, batch_id))


async def _batch_events(viewer: Viewer, batch_id: str) -> AsyncIterator[bytes]:
    last: tuple[object, ...] | None = None
    quiet = 0.0
    while True:
        batch = await viewer.batches.batch(batch_id)
        if batch is None or not batch.live:
            status = batch.status if batch else "gone"
            yield _frame("done", {"status": status})
            return
        seen = (batch.status, batch.done, batch.ok, batch.error, batch.running, batch.note)
        if seen != last:
            last, quiet = seen, 0.0
            yield _frame("progress", {"status": batch.status, "done": batch.done})
        elif quiet >= KEEP_ALIVE_S:
            quiet = 0.0
            yield KEEP_ALIVE
        await asyncio.sleep(BATCH_POLL_S)
        quiet += BATCH_POLL_S


def _frame(event: str, data: dict[str, object]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
