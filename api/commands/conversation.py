"""What the run and demo commands do, apart from parsing their options."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from openai import AsyncOpenAI, OpenAIError
from rich.console import Console
from rich.markup import escape

from api.conversation import events
from api.conversation.agent import Agent, AgentOptions
from api.conversation.placement import fleet_started, place
from api.exceptions import ImageUnavailable, LocalStackError, ModelError, NoWorkersError
from api.model.client import ChatModel, model_client
from api.settings import OrchestratorSettings, get_settings
from worker.contract.run_limits import RunLimits

DEMO_PROMPT = (
    "Write a short note about toolq to notes.txt, read it back, find where it mentions Celery, "
    "list the text files, count its bytes in the sandbox, and tell me the weather in Paris."
)

#: ``toolq run``'s exit statuses. A conversation that ended is a success even when some of its
#: tool calls failed (the model saw each failure and answered anyway), unless the caller asks
#: otherwise with --fail-on-tool-error.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: What ends a conversation, or keeps one from starting, with exit status 1.
CONVERSATION_ERRORS = (ModelError, NoWorkersError, LocalStackError, ValueError, ImageUnavailable)
#: A failed call's message is shown up to this many characters, on one line.
FAILURE_SHOWN_CHARS = 300


def run_conversation(
    prompt: str,
    *,
    model: str | None,
    system: str | None,
    enable: list[str],
    max_turns: int | None,
    stream: bool,
    as_json: bool,
    fail_on_tool_error: bool = False,
    console: Console,
    err: Console,
    image: str | None = None,
    recreate: bool = False,
    network: str | None = None,
    limits: RunLimits | None = None,
) -> int:
    """``toolq run``: 0 once the conversation ended (the model answered, or the turn limit
    stopped it), 1 if it could not start or end (an image that cannot be run included), 2
    without a model API to talk to."""
    settings = get_settings()
    options: dict[str, Any] = {"model": model, "enable": enable}
    if image is not None:
        options |= {"image": image, "recreate": recreate}
    if network is not None:
        options["network"] = network
    if limits is not None:
        options["limits"] = limits
    if system is not None:
        options["system_prompt"] = system
    if max_turns is not None:
        options["max_turns"] = max_turns
    try:
        client = ChatModel.from_env(settings)
    except (ModelError, OpenAIError) as exc:
        say_error(err, f"no model API configured: {exc}")
        err.print("Try [bold]toolq demo[/bold].")
        return EXIT_USAGE
    # Streamed, failed calls show with the rest; otherwise each is a line on stderr as it fails.
    observers = [] if stream else [failed_call_printer(err)]
    try:
        with fleet_started(settings, place(settings)) as fleet_settings:
            transcript = asyncio.run(
                _converse(
                    client,
                    AgentOptions(**options),
                    fleet_settings,
                    prompt,
                    stream,
                    console,
                    observers,
                )
            )
    except CONVERSATION_ERRORS as exc:
        say_error(err, str(exc))
        return EXIT_FAILED
    if as_json:
        console.print_json(json.dumps(transcript))
    elif not stream:
        console.print(transcript["answer"])
    failed = any(call["is_error"] for call in transcript["tool_calls"])
    return EXIT_FAILED if fail_on_tool_error and failed else EXIT_OK


def run_demo(*, console: Console, err: Console) -> int:
    from api.scripted.script import DEFAULT_SCRIPT_PATH, Script
    from api.scripted.server import ScriptedServer

    settings = get_settings()
    console.print("[bold]toolq demo[/bold]: a scripted model, real workers, real tools.")
    if settings.local_mode:
        console.print("Starting a local stack (Redis + a tools and a sandbox worker)...")
    try:
        with (
            ScriptedServer(Script.load(DEFAULT_SCRIPT_PATH)) as server,
            fleet_started(settings, place(settings)) as fleet_settings,
        ):
            client = model_client(
                base_url=server.base_url,
                api_key="scripted",
                timeout=settings.llm_timeout_s,
                max_retries=settings.llm_max_retries,
            )
            options = AgentOptions(model="scripted", enable=["run_bash"])
            transcript = asyncio.run(
                _converse(client, options, fleet_settings, DEMO_PROMPT, True, console)
            )
    except CONVERSATION_ERRORS as exc:
        say_error(err, str(exc))
        return EXIT_FAILED
    calls = transcript["tool_calls"]
    failed = sum(1 for c in calls if c["is_error"])
    console.print(
        f"\n[bold]{len(calls)} tool calls[/bold] ({failed} failed) in "
        f"{transcript['usage']['total_tokens']} tokens, run {transcript['run_id']}."
    )
    return 1 if failed else 0


async def _converse(
    client: AsyncOpenAI | ChatModel,
    options: AgentOptions,
    settings: OrchestratorSettings,
    prompt: str,
    stream: bool,
    console: Console,
    observers: list[Callable[[events.AgentEvent], None]] | None = None,
) -> dict[str, Any]:
    try:
        async with Agent(client, options, settings=settings) as agent:
            agent.observers.extend(observers or [])
            answer = ""
            if stream:
                async for event in agent.stream_chat(prompt):
                    render_event(event, console)
                    if isinstance(event, events.FinalAnswer):
                        answer = event.text
            else:
                answer = await agent.chat(prompt)
            return {"answer": answer, **agent.transcript()}
    finally:
        # In this loop: the client's connections belong to it.
        await (client.aclose() if isinstance(client, ChatModel) else client.close())


def render_event(event: events.AgentEvent, console: Console) -> None:
    if isinstance(event, events.TextDelta):
        console.print(event.text, end="", markup=False)
    elif isinstance(event, events.TextDiscarded):
        console.print(f"\n[yellow](stream interrupted: {event.reason}; retrying)[/yellow]")
    elif isinstance(event, events.ToolCallStarted):
        console.print(f"\n[cyan]→ {event.name}[/cyan] {event.arguments}", markup=True)
    elif isinstance(event, events.ToolCallFinished):
        mark = (
            f"[red]✗[/red] {event.name} ({event.error_kind})"
            if event.is_error
            else (f"[green]✓[/green] {event.name}")
        )
        console.print(
            f"{mark} in {event.duration_ms:.1f} ms on {event.worker or '?'}: "
            f"[dim]{escape(_first_line(event.output)[:100])}[/dim]"
        )
    elif isinstance(event, events.FinalAnswer):
        console.print()


def failed_call_printer(err: Console) -> Callable[[events.AgentEvent], None]:
    """An agent observer that prints each failed tool call in one line: the tool, why it failed
    (the error kind) and the first line of its message."""

    def print_failure(event: events.AgentEvent) -> None:
        if isinstance(event, events.ToolCallFinished) and event.is_error:
            message = _first_line(event.output)[:FAILURE_SHOWN_CHARS]
            err.print(
                f"✗ {event.name} failed ({event.error_kind}): {message}",
                markup=False,
                soft_wrap=True,
            )

    return print_failure


def say_error(err: Console, message: str) -> None:
    """``error: <message>`` on one line, whatever the terminal's width and the brackets in it."""
    err.print(f"error: {message}", markup=False, soft_wrap=True, highlight=False)


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else ""
