"""This process's MCP servers, as the fleet's settings list them for the pools it serves.

One host per process: a worker's main process starts the servers to learn their tools for the
manifest and stops them; each pool process starts its own after the fork (a thread does not
survive one) and keeps them for its calls.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from worker.contract.mcp_servers import McpServerConfig, load_servers
from worker.contract.settings import WorkerSettings
from worker.contract.wire import Pool
from worker.exceptions import McpUnavailableError
from worker.tools.interface import ExecutableTool

if TYPE_CHECKING:
    from worker.mcp.host import McpHost

log = logging.getLogger(__name__)


_host: McpHost | None = None
_problems: dict[str, str] = {}
_owner: tuple[int, frozenset[str]] | None = None


def start_hosting(settings: WorkerSettings, pools: Iterable[Pool]) -> McpHost | None:
    """This process's host of the servers of ``pools``, starting them if it has not yet (it
    returns at once); None when the fleet hosts no MCP server."""
    global _host, _owner
    if settings.mcp_servers is None:
        return None
    wanted = (os.getpid(), frozenset(pools))
    if _host is not None and _owner == wanted:
        return _host
    # This process's host of other pools stops; one made before a fork is the parent's to stop.
    stop_hosting()
    try:
        from worker.mcp.host import McpHost
    except ImportError as exc:
        raise McpUnavailableError(
            f"TOOLQ_MCP_SERVERS is set, but the mcp package is not installed ({exc}): "
            "pip install 'toolq[mcp]'"
        ) from exc
    _host, _owner = McpHost(servers_of(settings, wanted[1])), wanted
    _host.start()
    return _host


def servers_of(settings: WorkerSettings, pools: Iterable[str]) -> list[McpServerConfig]:
    """The servers the workers of ``pools`` host."""
    if settings.mcp_servers is None:
        return []
    served = set(pools)
    return [server for server in load_servers(settings.mcp_servers) if server.pool in served]


def stop_hosting() -> None:
    global _host, _owner
    if _host is not None and _owner is not None and _owner[0] == os.getpid():
        _host.stop()
    _host = _owner = None


def unavailable() -> dict[str, str]:
    """This process's MCP tools it cannot serve, and why: a server that is not running (as
    ``<server>__*``), a tool whose name or schema no model API takes."""
    if _host is None:
        return dict(_problems)
    problems = {
        _host.connections[name].config.tool_name("*"): f"MCP server {name!r} {problem}"
        for name, problem in _host.unavailable().items()
    }
    return problems | _problems


def hosted_tools(settings: WorkerSettings, pools: Iterable[Pool]) -> list[ExecutableTool]:
    """The tools of the servers of ``pools``, once each has started or failed to."""
    _problems.clear()
    try:
        host = start_hosting(settings, pools)
    except McpUnavailableError as exc:
        log.error("%s", exc)
        for server in servers_of(settings, pools):
            _problems[server.tool_name("*")] = f"MCP server {server.name!r} cannot start: {exc}"
        return []
    if host is None:
        return []
    from worker.mcp.tools import hosted_tool

    host.wait_started()
    # The call's soft time limit ends a wait first; this bounds one that has none.
    wait_s = settings.hard_limit_s
    tools: list[ExecutableTool] = []
    for name, connection in host.connections.items():
        for listed in connection.tools:
            try:
                tools.append(hosted_tool(connection.config, listed, host, wait_s))
            except (ValueError, TypeError) as exc:
                full_name = connection.config.tool_name(listed.name)
                _problems[full_name] = f"MCP server {name!r} gives a tool toolq cannot offer: {exc}"
                log.error("not serving %s: %s", full_name, _problems[full_name])
    return tools
