"""The ``toolq`` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from api.settings import get_settings
from worker.protocol import AGENTS_QUEUE, POOLS

app = typer.Typer(
    name="toolq",
    help="Run LLM agents' tool calls as Celery tasks on sandboxed workers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


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
    served = (*POOLS, AGENTS_QUEUE)
    if pool not in served:
        raise typer.BadParameter(f"pool must be one of {', '.join(served)}", param_hint="--pool")
    if pool == AGENTS_QUEUE:
        from api.llm import ModelError, model_api_from_env

        try:
            model_api_from_env()
        except ModelError as exc:
            err.print(f"[red]Error:[/red] an agents worker asks the model: {escape(str(exc))}")
            raise typer.Exit(2) from None
    from api.local.stack import worker_argv

    argv = worker_argv(pool, node=f"{pool}@%h", concurrency=concurrency, loglevel=loglevel)
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
) -> None:
    """Run one conversation against OPENAI_BASE_URL / OPENAI_API_KEY and print the answer."""
    from api.commands.conversation import run_conversation

    code = run_conversation(
        prompt,
        model=model,
        system=system,
        enable=enable or [],
        max_turns=max_turns,
        stream=stream,
        as_json=as_json,
        console=console,
        err=err,
    )
    raise typer.Exit(code)


@app.command()
def demo() -> None:
    """A scripted conversation on a local stack: needs no API key."""
    from api.commands.conversation import run_demo

    raise typer.Exit(run_demo(console=console, err=err))


@app.command()
def tools() -> None:
    """The fleet's tools: pool, on by default or not, live workers serving each."""
    from api.commands.conversation import show_tools

    raise typer.Exit(show_tools(console=console))


@app.command()
def status() -> None:
    """Queue depths, live workers per pool, calls in flight."""
    from api.commands.conversation import show_status

    raise typer.Exit(show_status(console=console))


@app.command()
def batch(
    input_path: Annotated[Path, typer.Argument(help="JSONL: {id, prompt, ...} a line.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="JSONL results (resumable).")],
    concurrency: Annotated[int, typer.Option(help="Conversations in flight.")] = 100,
    model: Annotated[str | None, typer.Option(help="Default model for lines without one.")] = None,
    on_fleet: Annotated[
        bool,
        typer.Option(
            "--on-fleet", help="Run the conversations on agents workers, not in this process."
        ),
    ] = False,
) -> None:
    """Run many conversations; rerun the same command to resume."""
    from api.batch.command import run_batch_command

    raise typer.Exit(
        run_batch_command(
            input_path, output, concurrency=concurrency, model=model, on_fleet=on_fleet, err=err
        )
    )


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
) -> None:
    """The HTTP API (runs, batches, tools, SSE events, metrics)."""
    from api.http.server import serve as serve_api

    serve_api(host=host, port=port)


@app.command("scripted-llm")
def scripted_llm(
    script: Annotated[Path | None, typer.Option(help="Script JSON (default: the demo).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8900,
) -> None:
    """An OpenAI-compatible server that replays scripted answers (for tests and demos)."""
    from api.scripted.server import serve as serve_scripted

    try:
        serve_scripted(script, host, port)
    except ValueError as exc:  # the script file is missing or not a script
        err.print("[red]Error:[/red]", escape(str(exc)), soft_wrap=True)
        raise typer.Exit(2) from None


def main() -> None:
    try:
        get_settings()
    except ValueError as exc:
        err.print(f"[red]Invalid TOOLQ_ settings:[/red] {exc}")
        sys.exit(2)
    app()


if __name__ == "__main__":
    main()
