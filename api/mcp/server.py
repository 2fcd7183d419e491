"""The MCP server in front of the fleet: each MCP session is one run with a workspace of its own.

Its tools are the fleet's model tools, on and off as a ``ToolChoice`` says, with the schemas the
workers publish. A call goes through the session's ``RunTools`` registry, and so through the
queue to a worker, with the deadline, output cap and at-most-once rule of any tool call; a
failure comes back as an MCP tool error (``isError``) with the text a model would read.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from redis.exceptions import RedisError

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.calls.run_tools import RunTools
from api.exceptions import FileProblemError, ImageUnavailable, NoWorkersError, ServiceCallError
from api.process.logs import log_context
from api.runs.environment import ImageVet, RunEnvironment
from api.runs.workspace import RunWorkspace
from worker.contract.network import NetworkChoice
from worker.contract.run_limits import RunLimits
from worker.contract.wire import ToolContextSnapshot

log = logging.getLogger(__name__)

#: A session unused this long is forgotten (the HTTP transport closes it after as long).
SESSION_IDLE_TIMEOUT_S = 30 * 60
#: Where a call's answer says which worker ran it and for how long (``_meta`` of the result).
META_PREFIX = "toolq/"


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """Which tools a session has beyond the defaults, and a deadline for all its calls."""

    enable: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    tool_timeout_ms: int | None = None
    #: The OCI image the session's commands run in: one container for the session's run,
    #: started at its first call and ended with it (``api.images``).
    image: str | None = None
    #: The session's run's network (``worker.contract.network``), as written.
    network: NetworkChoice = "none"
    #: The session's run's own limits for its commands (``worker.contract.run_limits``).
    limits: RunLimits | None = None
    #: The tenant whose token opened the session (over HTTP); None: no tenants.
    tenant: str | None = None


#: The session a request belongs to (None: the request came without one) and its tool choice.
SessionOf = Callable[[ServerRequestContext[Any]], tuple[str | None, ToolChoice]]


@dataclass
class _Session:
    tools: RunTools
    last_used: float
    #: A tool was called, so the run may have a workspace on the fleet.
    called: bool = False
    #: The run's container, with an image.
    environment: RunEnvironment | None = None


@dataclass(eq=False)
class SessionRuns:
    """One run per MCP session: made at the session's first request, ended when the session
    ends or has been idle for ``idle_timeout_s``, and its workspace removed then. Every
    session's calls share one ``Dispatcher``."""

    fleet: Callable[[], Awaitable[Fleet]]
    dispatcher: Dispatcher
    _: KW_ONLY
    idle_timeout_s: float = SESSION_IDLE_TIMEOUT_S
    removal_wait_s: float = 0.0
    clock: Callable[[], float] = time.monotonic
    #: Looks at a session's image before its container starts (where tokens are used).
    image_vet: ImageVet | None = None
    #: Why a session (of a tenant, or None) may not have the network it asks for
    #: (TOOLQ_NETWORK_ALLOWED, TOOLQ_TENANT_NETWORK_ALLOWED), or None.
    network_refusal: Callable[[NetworkChoice, str | None], str | None] = lambda *_: None
    #: Why a session (of a tenant, or None) may not have the limits it asks for
    #: (TOOLQ_LIMITS_MAX_*, TOOLQ_MAX_TIMEOUT_MS), or None.
    limits_refusal: Callable[[RunLimits, str | None], str | None] = lambda *_: None
    _sessions: dict[str, _Session] = field(default_factory=dict, init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    #: The workspaces of ended sessions being removed, by the task removing each.
    _removals: dict[asyncio.Task[None], str] = field(default_factory=dict, init=False)

    async def tools(self, session: str, choice: ToolChoice, *, calling: bool = False) -> RunTools:
        """The session's tools, made with ``choice`` on its first request; ``calling``: for a
        call of a tool."""
        async with self._lock:
            now = self.clock()
            self.end_idle(now)
            known = self._sessions.get(session)
            if known is None:
                refused = self.network_refusal(choice.network, choice.tenant)
                if refused is None and choice.limits is not None:
                    refused = self.limits_refusal(choice.limits, choice.tenant)
                if refused is not None:
                    raise ValueError(refused)
                tools = await self.preview(choice)
                known = _Session(tools, now)
                # Its run's own limits and network (``Dispatcher``), let go when it ends.
                if choice.limits is not None:
                    self.dispatcher.limits[tools.run_id] = choice.limits
                if choice.network != "none":
                    self.dispatcher.networks[tools.run_id] = choice.network
                if choice.image is not None:
                    fleet = await self.fleet()
                    known.environment = RunEnvironment(
                        self.dispatcher, fleet, tools.run_id, choice.image, vet=self.image_vet
                    )
                self._sessions[session] = known
            known.last_used = now
            known.called = known.called or calling
            environment = known.environment
        if calling and environment is not None and environment.started is None:
            # ImageUnavailable: the call's answer says why, in one line.
            await environment.start()
        return known.tools

    async def preview(self, choice: ToolChoice) -> RunTools:
        """Tools as a new session with ``choice`` would have them; ``ValueError`` names a tool
        ``choice`` asks for that the fleet does not serve, ``NoWorkersError`` an empty fleet."""
        fleet = (await self.fleet()).require_tools()
        # Started with the first session: a server nobody connects to reads no replies.
        await self.dispatcher.start()
        return RunTools(
            self.dispatcher,
            fleet.model_tools.values(),
            f"mcp-{uuid.uuid4().hex[:16]}",
            ToolContextSnapshot,
            fleet=fleet,
            timeout_ms=choice.tool_timeout_ms,
            enable=choice.enable,
            disable=choice.disable,
        )

    def end(self, session: str) -> None:
        """The session ended: its run's workspace is removed in the background, once no call
        of the run is in flight (waiting up to ``removal_wait_s`` for those that are)."""
        ended = self._sessions.pop(session, None)
        if ended is None:
            return
        run_id = ended.tools.run_id
        self.dispatcher.networks.pop(run_id, None)
        self.dispatcher.limits.pop(run_id, None)
        if not ended.called:
            return
        removal = asyncio.create_task(
            self._remove(run_id, self.removal_wait_s, ended.environment),
            name=f"toolq-mcp-remove-{run_id}",
        )
        self._removals[removal] = run_id
        removal.add_done_callback(lambda done: self._removals.pop(done, None))

    def end_idle(self, now: float | None = None) -> None:
        """End the sessions unused for longer than ``idle_timeout_s`` (at ``now``, or the
        clock's time)."""
        now = self.clock() if now is None else now
        idle = [k for k, s in self._sessions.items() if now - s.last_used > self.idle_timeout_s]
        for key in idle:
            self.end(key)

    async def close(self) -> None:
        """Every session ends (the server stops). Their workspaces are removed now, but for
        those with a call of the run still in flight: the workers remove them once their
        lifetime (``TOOLQ_WORKSPACE_TTL_S``) has passed."""
        waiting = list(self._removals)
        runs: list[tuple[str, RunEnvironment | None]] = [(r, None) for r in self._removals.values()]
        runs += [(s.tools.run_id, s.environment) for s in self._sessions.values() if s.called]
        self._sessions.clear()
        for removal in waiting:
            removal.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        await asyncio.gather(*(self._remove(run_id, 0.0, env) for run_id, env in runs))

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    async def _remove(
        self, run_id: str, wait_s: float, environment: RunEnvironment | None = None
    ) -> None:
        try:
            if environment is not None:
                await environment.end()
            workspace = RunWorkspace(self.dispatcher, await self.fleet(), run_id)
            await workspace.remove(wait_s=wait_s)
        except (ServiceCallError, FileProblemError, NoWorkersError, RedisError) as exc:
            log.warning("the workspace of MCP run %s stays: %s", run_id, exc)


def fleet_mcp_server(runs: SessionRuns, session_of: SessionOf) -> Server[Any]:
    """An MCP server whose tools are the fleet's, one run per session as ``session_of`` tells."""

    async def tools_of(ctx: ServerRequestContext[Any], listing: bool) -> RunTools:
        session, choice = session_of(ctx)
        try:
            if session is not None:
                return await runs.tools(session, choice, calling=not listing)
            if listing:
                return await runs.preview(choice)
        except ValueError as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        except NoWorkersError as exc:
            raise MCPError(code=INTERNAL_ERROR, message=str(exc)) from None
        raise MCPError(
            code=INVALID_REQUEST,
            message="toolq keeps a workspace per MCP session, and this call came without one "
            "(the stateless 2026-07-28 protocol): connect with the initialize handshake, "
            "which this server offers to clients that ask it with server/discover",
        )

    async def list_tools(
        ctx: ServerRequestContext[Any], _: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = await tools_of(ctx, listing=True)
        return types.ListToolsResult(tools=mcp_tools(tools))

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            tools = await tools_of(ctx, listing=False)
        except ImageUnavailable as exc:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"Error: {exc}")],
                is_error=True,
                _meta={f"{META_PREFIX}error_kind": "environment_lost"},
            )
        call_id = f"mcp-{ctx.request_id}"
        with log_context(run_id=tools.run_id, tool_call_id=call_id):
            outcome = await tools.registry.run(params.name, params.arguments, tool_call_id=call_id)
        meta: dict[str, Any] = {f"{META_PREFIX}run_id": tools.run_id}
        if outcome.worker is not None:
            meta[f"{META_PREFIX}worker"] = outcome.worker
        if outcome.duration_ms is not None:
            meta[f"{META_PREFIX}duration_ms"] = outcome.duration_ms
        if outcome.error_kind is not None:
            meta[f"{META_PREFIX}error_kind"] = outcome.error_kind
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=outcome.output)],
            is_error=outcome.is_error,
            _meta=meta,
        )

    return Server(
        "toolq",
        version="0.1.0",
        instructions="Tools that run on a toolq fleet, in a workspace of this session's own.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def mcp_tools(tools: RunTools) -> list[types.Tool]:
    """The enabled tools as MCP has them: the schemas the workers publish, and whether a call
    is safe to repeat."""
    listed = []
    for schema in tools.registry.get_enabled_schemas():
        function = schema["function"]
        tool = tools.registry.get(function["name"])
        idempotent = bool(tool is not None and tool.idempotent)
        listed.append(
            types.Tool(
                name=function["name"],
                description=function["description"],
                input_schema=function["parameters"],
                annotations=types.ToolAnnotations(idempotent_hint=idempotent),
            )
        )
    return listed


def handshake_only(server: Server[Any]) -> None:
    """Make ``server`` offer only the protocol versions that have sessions.

    A client in auto mode asks ``server/discover`` first and takes the stateless 2026-07-28
    protocol when offered, whose requests belong to no session; offered only the handshake
    versions, it opens a session with ``initialize`` instead.
    """

    async def discover(
        _: ServerRequestContext[Any], __: types.RequestParams | None
    ) -> types.DiscoverResult:
        return types.DiscoverResult(
            supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
            capabilities=server.get_capabilities(),
            instructions=server.instructions,
        )

    server.add_request_handler("server/discover", types.RequestParams, discover)
