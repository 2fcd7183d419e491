"""The ``toolq`` command."""

from __future__ import annotations

import os
import sys
import uuid
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Annotated

import typer

from api.commands.checks import (
    checked_image,
    checked_limits,
    checked_network,
    checked_settings,
    console,
    err,
    reachable_fleet,
)
from api.commands.servers import mcp, scripted_llm, serve, view
from api.commands.usage_errors import COMMAND_LINE_ERROR, exit_refused
from api.settings import get_settings
from worker.contract.settings_check import debugging
from worker.contract.wire import AGENTS_QUEUE, POOLS

app = typer.Typer(
    name="toolq",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Click's plain help: flags are shown without a value type (typer's rich help would print
    # `--stream <bool>`, as if it took one).
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

#: The exit status of an error nobody foresaw (its traceback shows with TOOLQ_DEBUG=1).
EXIT_UNEXPECTED = 1


def _print_version(asked: bool) -> None:
    if asked:
        console.print(f"toolq {installed_version('toolq')}")
        raise typer.Exit()


@app.callback()
def _toolq(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True, callback=_print_version
        ),
    ] = False,
) -> None:
    """Run LLM agents' tool calls as Celery tasks on sandboxed workers.

    Settings are TOOLQ_* environment variables, checked before any command starts.
    """


@app.command()
def worker(
    pool: Annotated[
        str, typer.Option(help="What to serve: the tools or sandbox pool, or agents.")
    ] = "tools",
    concurrency: Annotated[
        int | None,
        typer.Option(help="Worker processes; for agents, conversations at once (threads)."),
    ] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Start a worker of one pool (the same as: celery -A worker.app worker -Q POOL), or an
    agents worker, which runs whole conversations (celery -A api.agents.app worker -Q agents)."""
    checked_settings()
    served = (*POOLS, AGENTS_QUEUE)
    if pool not in served:
        raise typer.BadParameter(f"pool must be one of {', '.join(served)}", param_hint="--pool")
    if pool == AGENTS_QUEUE:
        from api.exceptions import ModelError
        from api.model.client import model_api_from_env

        try:
            model_api_from_env()
        except ModelError as exc:
            err.print(f"error: an agents worker asks the model: {exc}", markup=False)
            raise typer.Exit(2) from None
    # Celery would print its banner, then retry a broker that is down a hundred times.
    reachable_fleet(local_too=True)
    from api.local.stack import worker_argv

    # A name of its own: two workers of one pool on a host would share a sandbox worker's own
    # queue, and a run's calls would reach the one that does not hold its container.
    node = f"{pool}-{uuid.uuid4().hex[:6]}@%h"
    argv = worker_argv(pool, node=node, concurrency=concurrency, loglevel=loglevel)
    os.execv(sys.executable, argv)


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="The user's message.")],
    model: Annotated[str | None, typer.Option(help="Model name (default TOOLQ_MODEL).")] = None,
    system: Annotated[str | None, typer.Option(help="System prompt.")] = None,
    enable: Annotated[list[str] | None, typer.Option(help="Switch a tool on (repeatable).")] = None,
    max_turns: Annotated[int | None, typer.Option(help="Model turns at most.")] = None,
    stream: Annotated[bool, typer.Option("--stream", help="Show text and tools live.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole transcript.")] = False,
    fail_on_tool_error: Annotated[
        bool,
        typer.Option("--fail-on-tool-error", help="Exit with status 1 if a tool call failed."),
    ] = False,
    image: Annotated[
        str | None,
        typer.Option(
            help="Run the commands in a container of this OCI image (oci:/layout:tag, "
            "oci-archive:/x.tar, docker-archive:/x.tar, or a registry name such as "
            "python:3.12-slim)."
        ),
    ] = None,
    recreate: Annotated[
        bool,
        typer.Option("--recreate", help="With --image: start a lost container again."),
    ] = False,
    network: Annotated[
        str | None,
        typer.Option(
            help="The run's network: none (the default), full, or comma-separated "
            "destinations host:port or CIDR:port (pypi.org:443,10.1.2.0/24:8080), as "
            "TOOLQ_NETWORK_ALLOWED permits."
        ),
    ] = None,
    limits: Annotated[
        str | None,
        typer.Option(
            help="The run's own limits for its commands: timeout_s, memory_mb, pids, cpu, "
            "e.g. memory_mb=512,pids=64 (or a JSON object), each at most TOOLQ_LIMITS_MAX_*."
        ),
    ] = None,
) -> None:
    """Run one conversation against OPENAI_BASE_URL / OPENAI_API_KEY and print the answer.

    Each failed tool call is a line on stderr. Exit status: 0 when the conversation ended, even
    if tool calls failed (unless --fail-on-tool-error); 1 when it could not start or finish
    (the broker, workers or model API failing); 2 for wrong settings or no model API.
    """
    checked_settings()
    checked_image(image)
    checked_network(network)
    run_limits = checked_limits(limits)
    reachable_fleet()
    from api.commands.conversation import run_conversation

    code = run_conversation(
        prompt,
        model=model,
        system=system,
        enable=enable or [],
        max_turns=max_turns,
        stream=stream,
        as_json=as_json,
        fail_on_tool_error=fail_on_tool_error,
        console=console,
        err=err,
        image=image,
        recreate=recreate,
        network=network,
        limits=run_limits,
    )
    raise typer.Exit(code)


@app.command()
def demo() -> None:
    """A scripted conversation on a local stack: needs no API key."""
    checked_settings()
    reachable_fleet()
    from api.commands.conversation import run_demo

    raise typer.Exit(run_demo(console=console, err=err))


@app.command()
def tools(
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON document: tools (as GET /v1/tools lists them), unavailable.",
        ),
    ] = False,
) -> None:
    """The fleet's tools: pool, on by default or not, live workers serving each."""
    checked_settings()
    reachable_fleet()
    from api.commands.fleet_report import show_tools

    raise typer.Exit(show_tools(console=console, err=err, as_json=as_json))


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Queue depths, live workers per pool, calls in flight."""
    checked_settings()
    reachable_fleet()
    from api.commands.fleet_report import show_status

    raise typer.Exit(show_status(console=console, err=err, as_json=as_json))


@app.command()
def wait(
    tools: Annotated[
        list[str] | None, typer.Argument(help="Tools that must have a live worker (run_bash...).")
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=0, help="Seconds to wait at most before giving up.")
    ] = 60,
    pid: Annotated[
        list[int] | None,
        typer.Option(help="A worker started in the background: stop at once if it exits."),
    ] = None,
) -> None:
    """Wait until the broker answers and live workers serve TOOLS, at most --timeout seconds.

    Exit status: 0 ready; 1 not in time, or a --pid ended (it will not serve); 2 no broker.
    """
    checked_settings()
    from api.commands.wait import EXIT_READY, wait_for_fleet

    waited = wait_for_fleet(get_settings(), tools or [], timeout_s=timeout, pids=pid or [])
    (console if waited.status == EXIT_READY else err).print(
        waited.line, markup=False, soft_wrap=True, highlight=False
    )
    raise typer.Exit(waited.status)


@app.command()
def prune(
    older_than: Annotated[
        str | None,
        typer.Option(help="Idle for at least this long: 90, 30m, 12h, 7d (TOOLQ_WORKSPACE_TTL_S)."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List, remove nothing.")] = False,
) -> None:
    """Remove run workspaces no call has touched for a while (never one in use)."""
    from api.commands.prune import run_prune

    try:
        code = run_prune(older_than, dry_run)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--older-than") from None
    raise typer.Exit(code)


@app.command()
def batch(
    input_path: Annotated[Path, typer.Argument(help="JSONL: {id, prompt, ...} a line.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="JSONL results (resumable).")],
    concurrency: Annotated[int, typer.Option(help="Conversations in flight.")] = 100,
    model: Annotated[str | None, typer.Option(help="Default model for lines without one.")] = None,
    retry_errors: Annotated[
        bool,
        typer.Option(
            "--retry-errors", help="Also run again the items whose result has status error."
        ),
    ] = False,
    on_fleet: Annotated[
        bool,
        typer.Option(
            "--on-fleet", help="Run the conversations on agents workers, not in this process."
        ),
    ] = False,
) -> None:
    """Run many conversations or tasks; rerun the same command to resume."""
    checked_settings()
    reachable_fleet()
    from api.commands.batch import run_batch_command

    raise typer.Exit(
        run_batch_command(
            input_path,
            output,
            concurrency=concurrency,
            model=model,
            err=err,
            retry_errors=retry_errors,
            on_fleet=on_fleet,
        )
    )


@app.command()
def report(
    results: Annotated[Path, typer.Argument(help="A toolq batch results file (JSONL).")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as one object.")
    ] = False,
) -> None:
    """Sum up a batch's results: statuses, pass rate, tokens, tool calls, failures, slowest."""
    from api.batch.report import run_report_command

    raise typer.Exit(run_report_command(results, as_json=as_json, out=console, err=err))


# Registered last, so that --help lists them after the others, as it always has.
app.command()(serve)
app.command()(mcp)
app.command()(view)
app.command("scripted-llm")(scripted_llm)


def main() -> None:
    """``toolq``: an error no command foresaw is one line, not a traceback, unless
    TOOLQ_DEBUG=1."""
    try:
        # Not standalone: Click's own usage errors come here, to be said as toolq says errors.
        code = app(standalone_mode=False)
    except COMMAND_LINE_ERROR as exc:
        exit_refused(exc)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(EXIT_UNEXPECTED)
    except Exception as exc:
        if debugging():
            raise
        print(
            f"error: {type(exc).__name__}: {exc} (TOOLQ_DEBUG=1 shows where)",
            file=sys.stderr,
        )
        sys.exit(EXIT_UNEXPECTED)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
