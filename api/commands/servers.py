"""The ``toolq`` commands that serve until stopped: the HTTP API (``serve``), the MCP server on
stdin/stdout (``mcp``), the results viewer (``view``) and the scripted model (``scripted-llm``).
``api.cli`` registers them on the ``toolq`` command."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from api.commands.checks import (
    EXIT_MISSING_DEPENDENCY,
    checked_image,
    checked_limits,
    checked_network,
    checked_settings,
    err,
    reachable_fleet,
)
from api.process.listening import port_option
from api.settings import get_settings


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, port_option("Port.")] = 8000,
) -> None:
    """The HTTP API (runs, batches, tools, SSE events, metrics) and the web viewer at /."""
    checked_settings()
    from api.http.server import serve as serve_api

    serve_api(host=host, port=port)


def mcp(
    enable: Annotated[list[str] | None, typer.Option(help="Switch a tool on (repeatable).")] = None,
    disable: Annotated[
        list[str] | None, typer.Option(help="Switch a tool off (repeatable).")
    ] = None,
    tool_timeout_ms: Annotated[
        int | None, typer.Option(min=1, help="Deadline of every call, in ms (default: the tool's).")
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(help="Run the session's commands in a container of this OCI image."),
    ] = None,
    network: Annotated[
        str | None,
        typer.Option(
            help="The session's network: none (the default), full, or comma-separated "
            "destinations host:port or CIDR:port, as TOOLQ_NETWORK_ALLOWED permits."
        ),
    ] = None,
    limits: Annotated[
        str | None,
        typer.Option(
            help="The session's own limits for its commands, e.g. memory_mb=512,pids=64 "
            "(timeout_s, memory_mb, pids, cpu), within TOOLQ_LIMITS_MAX_*."
        ),
    ] = None,
    broker: Annotated[
        str | None,
        typer.Option(
            help="The fleet's broker URL, as TOOLQ_BROKER_URL (an MCP client passes its server "
            "few of the shell's variables); neither: a local stack of its own."
        ),
    ] = None,
) -> None:
    """The fleet's tools as an MCP server on stdin/stdout: one run, one workspace. It says on
    stderr which fleet it serves."""
    try:
        from api.mcp.server import ToolChoice
        from api.mcp.stdio import serve_stdio
    except ImportError as exc:
        err.print(f"error: toolq mcp needs pip install 'toolq[mcp]' ({exc})", markup=False)
        raise typer.Exit(EXIT_MISSING_DEPENDENCY) from None
    if broker is not None:
        os.environ["TOOLQ_BROKER_URL"] = broker  # checked, then read, as the variable would be
        get_settings.cache_clear()
    checked_settings()
    checked_image(image)
    checked_network(network)
    own_limits = checked_limits(limits)
    reachable_fleet()
    from worker.contract.network import NetworkPolicy

    wanted = NetworkPolicy.parse(network).wire()
    choice = ToolChoice(
        tuple(enable or ()), tuple(disable or ()), tool_timeout_ms, image, wanted, own_limits
    )
    raise typer.Exit(serve_stdio(get_settings(), choice))


def view(
    results: Annotated[Path, typer.Argument(help="A batch's output JSONL (toolq batch -o).")],
    port: Annotated[int, port_option("Port on 127.0.0.1 (default: a free one).")] = 0,
    browser: Annotated[
        bool, typer.Option("--browser/--no-browser", help="Open the page in a browser.")
    ] = True,
) -> None:
    """Look through a batch's results in the web viewer: a read-only server on 127.0.0.1."""
    from api.http.viewer.view import view_results

    raise typer.Exit(view_results(results, port=port, open_browser=browser))


def scripted_llm(
    script: Annotated[Path | None, typer.Option(help="Script JSON (default: the demo).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, port_option("Port.")] = 8900,
) -> None:
    """An OpenAI-compatible server that replays scripted answers (for tests and demos)."""
    checked_settings()
    from api.scripted.server import serve as serve_scripted

    try:
        serve_scripted(script, host, port)
    except ValueError as exc:  # the script file is missing or not a script
        err.print(f"error: {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
