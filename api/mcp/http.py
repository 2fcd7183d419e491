"""``/mcp`` on the HTTP API: the fleet's tools over MCP's Streamable HTTP, behind the API's token.

Each MCP session (the ``Mcp-Session-Id`` the SDK's session manager gives) is one run, and the
tenant's whose token opened it: another token's requests for it are answered as for an unknown
session (``api.mcp.tenancy``), and a tenant holds at most ``TOOLQ_TENANT_MAX_MCP_SESSIONS`` at
once. Session ids never reach the logs (``api.mcp.session_log``). The URL's query picks a
session's tools as ``toolq run``'s options do:
``/mcp?enable=run_bash&disable=remove&tool_timeout_ms=5000``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from starlette.datastructures import Headers, QueryParams
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.images.sources import tenant_vet
from api.mcp.server import (
    SESSION_IDLE_TIMEOUT_S,
    SessionRuns,
    ToolChoice,
    fleet_mcp_server,
    handshake_only,
)
from api.mcp.session_log import hide_session_ids
from api.mcp.tenancy import (
    OwnedSessions,
    opening_request,
    principal,
    read_body,
    refusal,
    tenant_of,
)
from api.runs.workspace import calls_end_within_s
from api.settings import OrchestratorSettings
from api.state.tenant_caps import MCP_SESSIONS, CapReached, Holding, TenantCaps
from worker.contract.errors import ImageError
from worker.contract.image_reference import parse_reference
from worker.contract.network import NetworkChoice, NetworkPolicy
from worker.contract.run_limits import RunLimits

#: Without a token the API listens on loopback only; a web page must not reach it by a name
#: that resolves there (DNS rebinding), so only loopback Host headers are served.
LOOPBACK_ONLY = TransportSecuritySettings(
    enable_dns_rebinding_protection=True,
    allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
    allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
)
#: What the MCP URL's query may say of a session.
QUERY_PARAMETERS = ("enable", "disable", "tool_timeout_ms", "image", "network", "limits")
#: How often sessions are looked at for having been idle too long.
IDLE_ROUND_S = 60.0


class McpEndpoint:
    """The ASGI app of ``/mcp`` and what it runs while the API is up (``running``)."""

    def __init__(
        self,
        settings: OrchestratorSettings,
        fleet: Callable[[], Awaitable[Fleet]],
        caps: TenantCaps,
    ):
        self._settings = settings
        self._fleet = fleet
        self._caps = caps
        self._parts: tuple[Dispatcher, SessionRuns, OwnedSessions] | None = None
        #: Each open session's place under its tenant's cap, by session id.
        self._places: dict[str, Holding] = {}
        #: Places of ended sessions being given back.
        self._giving_back: set[asyncio.Task[None]] = set()
        hide_session_ids()

    def _start_parts(self) -> tuple[Dispatcher, SessionRuns, OwnedSessions]:
        """What one run of the API serves MCP with: made anew each time, since the SDK's session
        manager runs once and a closed dispatcher stays closed."""
        dispatcher = Dispatcher(self._settings)
        runs = SessionRuns(
            self._fleet,
            dispatcher,
            idle_timeout_s=SESSION_IDLE_TIMEOUT_S,
            removal_wait_s=calls_end_within_s(self._settings),
            image_vet=tenant_vet(self._settings) if self._settings.api_tokens_file else None,
            network_refusal=self._network_refusal,
            limits_refusal=self._limits_refusal,
        )
        server = fleet_mcp_server(runs, _session_of)
        handshake_only(server)
        manager = OwnedSessions(
            app=server,
            on_end=self._session_ended,
            session_idle_timeout=SESSION_IDLE_TIMEOUT_S,
            security_settings=(
                None
                if self._settings.api_token or self._settings.api_tokens_file
                else LOOPBACK_ONLY
            ),
        )
        return dispatcher, runs, manager

    @property
    def runs(self) -> SessionRuns:
        if self._parts is None:
            raise RuntimeError("the MCP endpoint is not running")
        return self._parts[1]

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager, run for as long as the block lasts.

        It runs in a task of its own: its task group must end in the task it began in, and
        whoever runs the app's lifespan may begin and end it in different tasks.
        """
        dispatcher, runs, manager = self._parts = self._start_parts()
        started, stop = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with manager.run():
                started.set()
                await stop.wait()

        async def end_idle_sessions() -> None:
            # The SDK closes an idle session without telling: its run ends here, as long after.
            while True:
                await asyncio.sleep(IDLE_ROUND_S)
                runs.end_idle()

        holder = asyncio.create_task(hold(), name="toolq-mcp-sessions")
        idler = asyncio.create_task(end_idle_sessions(), name="toolq-mcp-idle-sessions")
        ready = asyncio.create_task(started.wait())
        try:
            await asyncio.wait([holder, ready], return_when=asyncio.FIRST_COMPLETED)
            if not ready.done():
                ready.cancel()
                holder.result()  # it ended before it started: raise why
            yield
        finally:
            stop.set()
            idler.cancel()
            await holder
            for session in list(self._places):
                self._session_ended(session)
            await asyncio.gather(*self._giving_back, return_exceptions=True)
            await runs.close()
            await dispatcher.close()
            self._parts = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._parts is None:
            raise RuntimeError("the MCP endpoint is not running")
        manager = self._parts[2]
        if scope["type"] != "http":
            await manager.handle_request(scope, receive, send)
            return
        tenant = tenant_of(scope)
        # The SDK serves a session only to the principal that opened it.
        scope["user"] = principal(tenant)
        if scope["method"] != "POST" or MCP_SESSION_ID_HEADER in Headers(scope=scope):
            await manager.handle_request(scope, receive, send)
            return
        body, receive = await read_body(receive)
        opens, request_id = opening_request(body)
        if not opens:
            await manager.handle_request(scope, receive, send)
            return
        try:
            place = await self._caps.take(MCP_SESSIONS, tenant)
        except CapReached as exc:
            await refusal(str(exc), request_id, 429)(scope, receive, send)
            return
        opened = False

        async def noting_the_session(message: Message) -> None:
            nonlocal opened
            if message["type"] == "http.response.start":
                session = Headers(raw=message["headers"]).get(MCP_SESSION_ID_HEADER)
                if session is not None:
                    # Kept before the answer leaves: the session may end at any time after.
                    self._places[session] = place
                    opened = True
            await send(message)

        try:
            await manager.handle_request(scope, receive, noting_the_session)
        finally:
            if not opened:
                self._give_back(place)

    def _session_ended(self, session: str) -> None:
        """However a session ended, its run ends and its place under its tenant's cap is free."""
        if self._parts is not None:
            self._parts[1].end(session)
        place = self._places.pop(session, None)
        if place is not None:
            self._give_back(place)

    def _network_refusal(self, network: NetworkChoice, tenant: str | None) -> str | None:
        """A session's network against the fleet's allowance, and its tenant's (``_scoped``)."""
        return self._settings.network_refusal(network, self._scoped(tenant))

    def _limits_refusal(self, limits: RunLimits, tenant: str | None) -> str | None:
        """A session's limits against the fleet's maximums, and its tenant's (``_scoped``)."""
        return self._settings.limits_refusal(limits, self._scoped(tenant))

    def _scoped(self, tenant: str | None) -> str | None:
        """The session's tenant where tokens name tenants, else None: the fleet's rules alone."""
        return tenant if self._settings.api_tokens_file else None

    def _give_back(self, place: Holding) -> None:
        task = asyncio.create_task(self._caps.give_back(place), name="toolq-mcp-place")
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)


def _session_of(ctx: ServerRequestContext[Any]) -> tuple[str | None, ToolChoice]:
    request = ctx.request
    if not isinstance(request, Request):
        return None, ToolChoice()
    choice = replace(tool_choice(request.query_params), tenant=tenant_of(request.scope))
    return request.headers.get(MCP_SESSION_ID_HEADER), choice


def tool_choice(query: QueryParams) -> ToolChoice:
    """``enable`` and ``disable`` (repeated, or comma-separated), ``tool_timeout_ms``,
    ``image`` (the OCI image the session's commands run in), ``network`` and ``limits``
    (``memory_mb=512,pids=64``: the run's own limits)."""
    unknown = sorted(set(query) - set(QUERY_PARAMETERS))
    if unknown:
        raise MCPError(
            code=INVALID_PARAMS,
            message=f"unknown query parameter(s) {', '.join(unknown)} in the MCP URL "
            f"(known: {', '.join(QUERY_PARAMETERS)})",
        )
    limits_text, image = query.get("limits"), query.get("image")
    try:
        limits = RunLimits.parse(limits_text) if limits_text is not None else None
        network = NetworkPolicy.parse(query.get("network")).wire()
        if image is not None:
            parse_reference(image)
    except (ValueError, ImageError) as exc:  # NetworkRefused is a ValueError
        raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
    timeout = query.get("tool_timeout_ms")
    if timeout is not None and not (timeout.isdigit() and int(timeout) > 0):
        raise MCPError(
            code=INVALID_PARAMS,
            message=f"tool_timeout_ms in the MCP URL must be a positive integer, not {timeout!r}",
        )
    return ToolChoice(
        enable=_names(query.getlist("enable")),
        disable=_names(query.getlist("disable")),
        tool_timeout_ms=int(timeout) if timeout is not None else None,
        image=image,
        network=network,
        limits=limits,
    )


def _names(values: list[str]) -> tuple[str, ...]:
    return tuple(name.strip() for value in values for name in value.split(",") if name.strip())
