"""What a viewer serves (its sources, whether it needs a token) and how it renders a page."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from fastapi import Request
from fastapi.templating import Jinja2Templates
from starlette.responses import Response

from api.http.viewer.sources import BatchSource, FleetSource, RunSource
from api.http.viewer.tickets import StreamTickets

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
#: Pages load only what this server sends: its own script and style, nothing inline.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # Live streams carry a ticket in their URL: no page passes its address on.
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Viewer:
    """One app's viewer: where its data comes from, and who may read it."""

    batches: BatchSource
    runs: RunSource | None = None
    fleet: FleetSource | None = None
    #: Set when the server has a token: pages are fetched with it, streams with tickets.
    tickets: StreamTickets | None = None
    name: str = "toolq"
    #: The one batch a results file is; None for a server's many.
    single_batch: str | None = None

    @property
    def needs_token(self) -> bool:
        return self.tickets is not None

    @property
    def home(self) -> str:
        """Where the name in the page's header leads: the batches, or the file's one batch."""
        if self.single_batch is None:
            return "/batches"
        return "/batches/" + quote(self.single_batch, safe="")

    def live_url(self, path: str, **params: str) -> str:
        """The URL of a live stream: with a ticket for it when the server has a token."""
        if self.tickets is not None:
            params = {**params, "ticket": self.tickets.mint(path)}
        return f"{path}?{urlencode(params)}" if params else path


@dataclass
class Page:
    """A page to render: its template, its title and what the template is given."""

    template: str
    title: str
    context: dict[str, Any] = field(default_factory=dict)
    status_code: int = 200


def not_found(what: str) -> Page:
    return Page("not_found.html", "Not found", {"what": what}, 404)


def templates() -> Jinja2Templates:
    """The templates, with autoescaping on for every one of them: model answers and tool
    outputs are text, never markup."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    shown: dict[str, Callable[[Any], str]] = {
        "num": lambda value: f"{value:,}",
        "seconds": _seconds,
        "ms": lambda value: f"{value:,.1f} ms",
        "bytes": _bytes,
        "when": lambda value: datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "ago": _ago,
        "percent": lambda value: f"{value:.0%}",
    }
    # A value that is not there shows as a dash, whatever the filter.
    env.filters.update({name: _or_dash(show) for name, show in shown.items()})
    env.filters["segment"] = lambda value: quote(str(value), safe="")
    return Jinja2Templates(env=env)


def render(
    request: Request, jinja: Jinja2Templates, viewer: Viewer, page: Page, *, in_shell: bool
) -> Response:
    """The page alone (fetched by the script) or inside the shell (a browser's first load)."""
    context = {**page.context, "page": page, "viewer": viewer, "request": request}
    return jinja.TemplateResponse(
        request,
        "shell.html" if in_shell else page.template,
        context,
        status_code=page.status_code,
        headers=SECURITY_HEADERS,
    )


def _or_dash(show: Callable[[Any], str]) -> Callable[[Any], str]:
    return lambda value: "—" if value is None else show(value)


def _seconds(value: float) -> str:
    if value < 60:
        return f"{value:.2f} s"
    return f"{int(value // 60)} min {value % 60:.0f} s"


def _bytes(value: int) -> str:
    if value < 1024:
        return f"{value:,} bytes"
    if value < 1024 * 1024:
        return f"{value / 1024:,.1f} KB"
    return f"{value / 1024 / 1024:,.1f} MB"


def _ago(value: float) -> str:
    seconds = max(time.time() - value, 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"
