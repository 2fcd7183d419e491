"""What the run, demo, tools and status commands do, apart from parsing their options."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis
from openai import AsyncOpenAI, OpenAIError
from rich.console import Console
from rich.table import Table

from api.agent import Agent, AgentOptions
from api.agents.messages import conversation_keys
from api.events import (
    AgentEvent,
    FinalAnswer,
    TextDelta,
    TextDiscarded,
    ToolCallFinished,
    ToolCallStarted,
)
from api.fleet import (
    NoWorkersError,
    calls_in_flight,
    load_fleet,
    queue_depths,
)
from api.llm import ChatModel, ModelError, model_client
from api.local.stack import LocalStackError, fleet_for
from api.settings import OrchestratorSettings, get_settings
from worker.protocol import AGENTS_QUEUE, POOLS

DEMO_PROMPT = (
    "Write a short note about toolq to notes.txt, read it back, find where it mentions Celery, "
    "list the text files, count its bytes in the sandbox, and tell me the weather in Paris."
)
DEMO_PLUGINS = ["worker.tools.weather"]


def run_conversation(
    prompt: str,
    *,
    model: str | None,
    system: str | None,
    enable: list[str],
    max_turns: int | None,
    stream: bool,
    as_json: bool,
    console: Console,
    err: Console,
) -> int:
    settings = get_settings()
    options: dict[str, Any] = {"model": model, "enable": enable}
    if system is not None:
        options["system_prompt"] = system
    if max_turns is not None:
        options["max_turns"] = max_turns
    try:
        client = ChatModel.from_env(settings)
    except (ModelError, OpenAIError) as exc:
        err.print(f"[red]No model API configured:[/red] {exc}\nTry [bold]toolq demo[/bold].")
        return 2
    try:
        with fleet_for(settings) as fleet_settings:
            transcript = asyncio.run(
                _converse(client, AgentOptions(**options), fleet_settings, prompt, stream, console)
            )
    except (ModelError, NoWorkersError, LocalStackError, ValueError) as exc:
        err.print(f"[red]Error:[/red] {exc}")
        return 1
    if as_json:
        console.print_json(json.dumps(transcript))
    elif not stream:
        console.print(transcript["answer"])
    return 0


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
            fleet_for(settings, plugins=DEMO_PLUGINS) as fleet_settings,
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
    except (ModelError, NoWorkersError, LocalStackError, ValueError) as exc:
        err.print(f"[red]Error:[/red] {exc}")
        return 1
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
) -> dict[str, Any]:
    try:
        async with Agent(client, options, settings=settings) as agent:
            answer = ""
            if stream:
                async for event in agent.stream_chat(prompt):
                    render_event(event, console)
                    if isinstance(event, FinalAnswer):
                        answer = event.text
            else:
                answer = await agent.chat(prompt)
            return {"answer": answer, **agent.transcript()}
    finally:
        # In this loop: the client's connections belong to it.
        await (client.aclose() if isinstance(client, ChatModel) else client.close())


def render_event(event: AgentEvent, console: Console) -> None:
    if isinstance(event, TextDelta):
        console.print(event.text, end="", markup=False)
    elif isinstance(event, TextDiscarded):
        console.print(f"\n[yellow](stream interrupted: {event.reason}; retrying)[/yellow]")
    elif isinstance(event, ToolCallStarted):
        console.print(f"\n[cyan]→ {event.name}[/cyan] {event.arguments}", markup=True)
    elif isinstance(event, ToolCallFinished):
        mark = "[red]✗[/red]" if event.is_error else "[green]✓[/green]"
        first_line = event.output.strip().splitlines()[0] if event.output.strip() else ""
        console.print(
            f"{mark} {event.name} in {event.duration_ms:.1f} ms on {event.worker or '?'}: "
            f"[dim]{first_line[:100]}[/dim]"
        )
    elif isinstance(event, FinalAnswer):
        console.print()


def show_tools(*, console: Console) -> int:
    settings = get_settings()
    with fleet_for(settings) as fleet_settings:
        fleet = load_fleet(fleet_settings.redis_url)
    table = Table("tool", "pool", "on by default", "live workers", "delivery")
    for spec in fleet.model_tools.values():
        table.add_row(
            spec.name,
            spec.pool,
            "yes" if spec.enabled_by_default else "no",
            str(len(fleet.workers.get(spec.pool, []))),
            "re-run if interrupted" if spec.idempotent else "at most once",
        )
    console.print(table)
    if not fleet.tools:
        console.print("No worker has published its tools yet.")
        return 1
    return 0


def show_status(*, console: Console) -> int:
    settings = get_settings()
    if settings.local_mode:
        console.print("No broker configured (TOOLQ_BROKER_URL): nothing is running to report on.")
        return 1
    fleet = load_fleet(settings.redis_url)
    depths = queue_depths(settings, (*POOLS, AGENTS_QUEUE))
    in_flight = calls_in_flight(settings)
    conversations = conversations_running(settings.redis_url)
    table = Table("pool", "queued", "live workers")
    for pool in POOLS:
        table.add_row(pool, str(depths.get(pool, "?")), str(len(fleet.workers.get(pool, []))))
    # Not a tool pool: agents workers run whole conversations, whose calls go to the pools above.
    table.add_section()
    table.add_row(AGENTS_QUEUE, str(depths.get(AGENTS_QUEUE, "?")), str(len(fleet.agents)))
    console.print(table)
    console.print(f"calls in flight: {in_flight}")
    console.print(f"conversations running: {conversations}")
    return 0


def conversations_running(redis_url: str) -> int:
    """Conversations an agents worker runs right now: those with a live lease (the broker's
    unacknowledged messages would also count those of workers that died, for an hour)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return sum(1 for _ in client.scan_iter(conversation_keys.lease("*"), count=1000))
    finally:
        client.close()
