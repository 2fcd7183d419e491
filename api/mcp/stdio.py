"""``toolq mcp``: the fleet's tools as an MCP server on stdin and stdout, one run per process.

stdout carries the protocol and nothing else: logs and errors go to stderr, and a local stack's
workers write to their own log files.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from types import FrameType

import anyio
from kombu.utils.url import maybe_sanitize_url
from mcp.server.stdio import stdio_server

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet, load_fleet
from api.conversation.placement import fleet_started, place
from api.exceptions import LocalStackError, NoWorkersError
from api.mcp.server import SessionRuns, ToolChoice, fleet_mcp_server
from api.settings import OrchestratorSettings

log = logging.getLogger(__name__)
#: The one session of a stdio server: the process's stdin and stdout.
STDIO_SESSION = "stdio"


def serve_stdio(settings: OrchestratorSettings, choice: ToolChoice) -> int:
    """Serve until the client closes stdin; 1 when there is no fleet or a tool asked for is not
    served (said on stderr, before anything is read from stdin)."""
    from api.process.logs import configure_logging

    configure_logging(settings)
    # A client that closes our stdin waits a moment, then sends SIGTERM: as an exception it
    # unwinds through fleet_started, which stops a local stack instead of leaving it orphaned.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    print(f"toolq mcp: serving {served_fleet(settings)}", file=sys.stderr, flush=True)
    try:
        with fleet_started(settings, place(settings)) as fleet_settings:
            anyio.run(_serve, fleet_settings, choice)
    except (NoWorkersError, LocalStackError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def served_fleet(settings: OrchestratorSettings) -> str:
    """Which fleet the server's calls go to, its password hidden. An MCP client passes its
    server few of the shell's variables, so a TOOLQ_BROKER_URL set there is not always here."""
    if settings.local_mode:
        return (
            "a local stack of its own (no --broker nor TOOLQ_BROKER_URL: an MCP client passes "
            "few of the shell's variables; set the broker in the server's config)"
        )
    return f"the fleet at {maybe_sanitize_url(settings.effective_broker_url)}"


def _exit_cleanly(signum: int, _: FrameType | None) -> None:
    raise SystemExit(0)


async def _serve(settings: OrchestratorSettings, choice: ToolChoice) -> None:
    fleet = await asyncio.to_thread(load_fleet, settings.redis_url)

    async def current_fleet() -> Fleet:
        return fleet

    async with Dispatcher(settings) as dispatcher:
        # --limits was checked against the maximums before the fleet was reached.
        runs = SessionRuns(current_fleet, dispatcher, idle_timeout_s=float("inf"))
        # Made now, so that a tool asked for that the fleet lacks stops the server at once.
        tools = await runs.tools(STDIO_SESSION, choice)
        log.info(
            "serving %d tools over stdio as run %s",
            len(tools.registry.get_enabled_schemas()),
            tools.run_id,
        )
        server = fleet_mcp_server(runs, lambda _: (STDIO_SESSION, choice))
        try:
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
        finally:
            # The client closed stdin: the session, and with it the run, is over.
            await runs.close()
