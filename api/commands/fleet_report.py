"""What the tools and status commands show: tables for a reader, or one JSON document (--json)
for a program. Names are never cut, in a terminal or through a pipe."""

from __future__ import annotations

import json
from typing import Any

import redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from api.calls.fleet import Fleet, calls_in_flight, load_fleet, queue_depths
from api.commands.conversation import EXIT_FAILED, say_error
from api.conversation.placement import fleet_started, place
from api.exceptions import LocalStackError
from api.settings import get_settings
from worker.contract.keys import conversation_keys
from worker.contract.wire import AGENTS_QUEUE, LAYER_RUN_UID, POOLS, WorkerInfo

#: Wider than any table toolq prints: how wide a table would be if nothing bounded it.
UNBOUNDED_WIDTH = 100_000


def show_tools(*, console: Console, err: Console, as_json: bool = False) -> int:
    """``toolq tools``: 0, or 1 when no worker has published its tools (or no stack started)."""
    settings = get_settings()
    try:
        with fleet_started(settings, place(settings)) as fleet_settings:
            fleet = load_fleet(fleet_settings.redis_url)
    except LocalStackError as exc:
        say_error(err, str(exc))
        return EXIT_FAILED
    if as_json:
        print_document(console, tools_document(fleet))
    else:
        print_table(console, tools_table(fleet))
        for workers in fleet.workers.values():
            for info in workers:
                for tools, why in info.unavailable.items():
                    console.print(
                        f"[red]unavailable[/red] {escape(tools)} on {info.worker}: {escape(why)}",
                        soft_wrap=True,
                    )
    if not fleet.tools:
        say_error(err, "no worker has published its tools yet")
        return EXIT_FAILED
    return 0


def tools_table(fleet: Fleet) -> Table:
    table = Table()
    table.add_column("tool", no_wrap=True, overflow="fold")
    for header in ("pool", "on by default", "live workers", "delivery"):
        table.add_column(header, overflow="fold")
    for spec in fleet.model_tools.values():
        table.add_row(
            spec.name,
            spec.pool,
            "yes" if spec.enabled_by_default else "no",
            str(len(fleet.workers.get(spec.pool, []))),
            "re-run if interrupted" if spec.idempotent else "at most once",
        )
    return table


def tools_document(fleet: Fleet) -> dict[str, Any]:
    """The tools as ``GET /v1/tools`` lists them, and the tools workers could not set up."""
    return {
        "tools": [
            {
                "name": spec.name,
                "pool": spec.pool,
                "description": spec.description,
                "parameters": spec.parameters,
                "enabled_by_default": spec.enabled_by_default,
                "idempotent": spec.idempotent,
                "live_workers": len(fleet.workers.get(spec.pool, [])),
            }
            for spec in fleet.model_tools.values()
        ],
        "unavailable": [
            {"worker": info.worker, "tools": tools, "reason": why}
            for workers in fleet.workers.values()
            for info in workers
            for tools, why in info.unavailable.items()
        ],
    }


def show_status(*, console: Console, err: Console, as_json: bool = False) -> int:
    """``toolq status``: 0, or 1 without a broker (nothing runs to report on)."""
    settings = get_settings()
    if settings.local_mode:
        say_error(err, "no broker configured (TOOLQ_BROKER_URL): nothing is running to report on")
        return EXIT_FAILED
    fleet = load_fleet(settings.redis_url)
    depths = queue_depths(settings, (*POOLS, AGENTS_QUEUE))
    in_flight = calls_in_flight(settings)
    conversations = conversations_running(settings.redis_url)
    sandboxes = sorted(
        (w for w in fleet.workers.get("sandbox", []) if w.limits is not None),
        key=lambda w: w.worker,
    )
    if as_json:
        print_document(
            console,
            {
                "pools": {
                    pool: {
                        "queued": depths.get(pool),
                        "live_workers": len(fleet.workers.get(pool, [])),
                    }
                    for pool in POOLS
                },
                "agents": {
                    "queued": depths.get(AGENTS_QUEUE),
                    "live_workers": len(fleet.agents),
                    "conversations_running": conversations,
                },
                "calls_in_flight": in_flight,
                "sandbox_workers": [
                    {"worker": w.worker, "limits": w.limits.model_dump(mode="json")}
                    for w in sandboxes
                    if w.limits is not None
                ],
            },
        )
        return 0
    table = Table()
    table.add_column("pool", no_wrap=True, overflow="fold")
    table.add_column("queued", overflow="fold")
    table.add_column("live workers", overflow="fold")
    for pool in POOLS:
        table.add_row(pool, str(depths.get(pool, "?")), str(len(fleet.workers.get(pool, []))))
    # Not a tool pool: agents workers run whole conversations, whose calls go to the pools above.
    table.add_section()
    table.add_row(AGENTS_QUEUE, str(depths.get(AGENTS_QUEUE, "?")), str(len(fleet.agents)))
    print_table(console, table)
    console.print(f"calls in flight: {in_flight}")
    console.print(f"conversations running: {conversations}")
    if sandboxes:
        print_table(console, limits_table(sandboxes))
    return 0


def conversations_running(redis_url: str) -> int:
    """Conversations an agents worker runs right now: those with a live lease (the broker's
    unacknowledged messages would also count those of workers that died, for an hour)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return sum(1 for _ in client.scan_iter(conversation_keys.lease("*"), count=1000))
    finally:
        client.close()


def limits_table(workers: list[WorkerInfo]) -> Table:
    """Which limits each sandbox worker applies to run_bash, and what enforces them."""
    table = Table()
    table.add_column("sandbox worker", no_wrap=True, overflow="fold")
    table.add_column("runs apart", overflow="fold")
    for header in ("memory", "processes", "CPU", "workspace quota", "isolation"):
        table.add_column(header, overflow="fold")
    for info in workers:
        assert info.limits is not None
        limits, box = info.limits, info.limits.sandbox
        quota = (
            f"{limits.workspace_quota_bytes / 2**20:,.0f} MiB by {limits.workspace_quota_by}"
            if limits.workspace_quota_bytes
            else "none"
        )
        if box is None:
            table.add_row(info.worker, "?", "?", "?", "?", quota, "?")
            continue
        table.add_row(
            info.worker,
            runs_apart(box.isolation),
            f"{box.memory_mb} MB by {box.memory_by}",
            f"{box.max_processes} by {box.processes_by}",
            f"accounted by {box.cpu_accounting_by}; a limit held by {box.cpu_limit_by}",
            f"{quota}; idle workspaces removed after {limits.workspace_ttl_s:,} s",
            box.problem or ", ".join(box.isolation),
        )
    return table


def runs_apart(isolation: list[str]) -> str:
    """Whether a sandbox worker keeps its runs apart, in words, from the layers it gives."""
    if LAYER_RUN_UID in isolation:
        return "yes: a uid per run"
    shared = next((layer for layer in isolation if layer.startswith("user:")), "one user")
    return f"no: runs share {shared.removeprefix('user:')} (TOOLQ_SANDBOX_SHARED=allow)"


def print_table(console: Console, table: Table) -> None:
    """``table`` with no cell cut: a terminal's width bounds it (names never wrap), and output
    that is not a terminal gets the table's whole width, where rich would take 80 columns and
    cut the names a grep looks for."""
    if console.is_terminal:
        console.print(table)
        return
    whole = console.measure(table, options=console.options.update_width(UNBOUNDED_WIDTH))
    width = console.width
    console.width = max(width, whole.maximum)
    try:
        console.print(table)
    finally:
        console.width = width


def print_document(console: Console, document: dict[str, Any]) -> None:
    """One JSON document, as it is: no markup, highlighting or wrapping read into it."""
    console.print(
        json.dumps(document, indent=2, ensure_ascii=False),
        markup=False,
        highlight=False,
        emoji=False,
        soft_wrap=True,
    )
