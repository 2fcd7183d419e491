"""Each page of the viewer: what it reads from the viewer's sources, and what it shows."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from api.batch.record import BatchRecord, CommandRun, Score
from api.batch.summary import UNREADABLE, as_text
from api.http.viewer import conversation
from api.http.viewer.charts import rate_chart
from api.http.viewer.conversation import Text
from api.http.viewer.lists import BATCH_STATUSES, RUN_STATUSES, ListFilters, pager
from api.http.viewer.lists import PER_PAGE_CHOICES as LIST_PER_PAGE
from api.http.viewer.table import (
    PER_PAGE_CHOICES,
    SCORES,
    STATUSES,
    STOP_REASONS,
    TOOL_ERRORS,
    ItemQuery,
    plain_page,
    select,
)
from api.http.viewer.viewer import Page, Viewer, not_found
from api.state.listing import Listed, ListQuery
from api.state.records import ACTIVE

#: The item fields the item page shows on their own; the rest of a record is in "more fields".
SHOWN_FIELDS = {
    "id",
    "status",
    "answer",
    "error",
    "stop_reason",
    "run_id",
    "model",
    "duration_s",
    "usage",
    "tool_calls",
    "messages",
    "score",
    "setup",
    "check",
    "artifacts",
    "metadata",
    "line",
}


async def batches_page(viewer: Viewer, params: Mapping[str, str]) -> Page:
    return await _list_page(
        "batches.html", "Batches", params, BATCH_STATUSES, viewer.batches.batches
    )


async def batch_page(viewer: Viewer, batch_id: str, params: Mapping[str, str]) -> Page:
    source = viewer.batches
    batch = await source.batch(batch_id)
    if batch is None:
        return not_found(f"batch {batch_id!r}")
    query, problems = ItemQuery.parse(params)
    if query.plain:
        start = (query.page - 1) * query.per_page
        first = await source.summaries(batch_id, start, query.per_page)
        items = plain_page(first, max(batch.done, start + len(first)), query)
    else:
        items = select(await source.all_summaries(batch_id), query)
    path = f"/ui/live/batches/{quote(batch_id, safe='')}"
    return Page(
        "batch.html",
        f"Batch {batch.title}",
        {
            "batch": batch,
            "query": query,
            "items": items,
            "problems": problems,
            "back": query.link(),
            "live_url": viewer.live_url(path) if batch.live else None,
            "choices": {
                "status": STATUSES,
                "stop_reason": (*STOP_REASONS, "none"),
                "score": SCORES,
                "tool_errors": TOOL_ERRORS,
                "per_page": PER_PAGE_CHOICES,
            },
        },
    )


async def item_page(viewer: Viewer, batch_id: str, number: int, params: Mapping[str, str]) -> Page:
    batch = await viewer.batches.batch(batch_id)
    record = await viewer.batches.record(batch_id, number - 1) if batch and number > 0 else None
    if batch is None or record is None:
        return not_found(f"item {number} of batch {batch_id!r}")
    # Every source answers a result line here, or a stand-in with an id that says why not.
    line = BatchRecord.read(record)
    view = conversation.from_transcript(line.messages, line.tool_calls)
    steps = (("Set-up", line.setup), ("Check", line.check))
    return Page(
        "item.html",
        f"Item {line.id}",
        {
            "batch": batch,
            "number": number,
            "item": _item_facts(line, record),
            "back": "?" + urlencode(params) if params else "",
            "has_next": number < batch.done,
            "view": view,
            "failed_calls": sum(call.is_error for call in view.tool_calls),
            "answer": None if line.answer is None else Text.of(line.answer),
            "score": None if line.score is None else _score(line.score),
            "steps": [(title, _step(run)) for title, run in steps if run is not None],
            "artifacts": _artifacts(line.artifacts or {}),
            "metadata": [
                (str(key), value if isinstance(value, str) else json.dumps(value))
                for key, value in (line.metadata or {}).items()
            ],
            "more": {k: Text.of(v) for k, v in record.items() if k not in SHOWN_FIELDS},
        },
    )


async def runs_page(viewer: Viewer, params: Mapping[str, str]) -> Page:
    if viewer.runs is None:
        return not_found("runs: this viewer reads a results file")
    return await _list_page("runs.html", "Runs", params, RUN_STATUSES, viewer.runs.runs)


async def run_page(viewer: Viewer, run_id: str) -> Page:
    if viewer.runs is None:
        return not_found("runs: this viewer reads a results file")
    run = await viewer.runs.run(run_id)
    if run is None:
        return not_found(f"run {run_id!r}")
    live_url = None
    if run.status in ACTIVE:
        events = await viewer.runs.events(run_id)
        view = conversation.from_events(run.prompt, events.events)
        path = f"/ui/live/runs/{quote(run_id, safe='')}"
        live_url = viewer.live_url(path, after=events.last_id)
    else:
        transcript = run.transcript or {}
        view = conversation.from_transcript(
            transcript.get("messages") or [{"role": "user", "content": run.prompt}],
            transcript.get("tool_calls") or [],
        )
    return Page(
        "run.html",
        f"Run {run.id}",
        {
            "run": run,
            "conversation": view,
            "live_url": live_url,
            "answer": Text.of(run.answer) if run.answer else None,
        },
    )


async def fleet_page(viewer: Viewer) -> Page:
    if viewer.fleet is None:
        return not_found("the fleet: this viewer reads a results file")
    fleet = await viewer.fleet.fleet()
    return Page("fleet.html", "Fleet", {"fleet": fleet, "chart": rate_chart(fleet.rates)})


async def _list_page(
    template: str,
    title: str,
    params: Mapping[str, str],
    statuses: Sequence[str],
    read: Callable[[ListQuery], Awaitable[Listed[Any]]],
) -> Page:
    """A page of the runs or the batches, as ``read`` answers the address's filters."""
    filters, problems = ListFilters.parse(params, statuses)
    listed = await read(filters.query())
    return Page(
        template,
        title,
        {
            "rows": listed.rows,
            "pager": pager(listed, filters),
            "filters": filters,
            "problems": problems,
            "choices": {"status": statuses, "per_page": LIST_PER_PAGE},
        },
    )


def _item_facts(line: BatchRecord, record: Mapping[str, Any]) -> dict[str, Any]:
    """The scalars of an output record; a field it lacks, or has in another shape, is None. The
    stand-in for a line that is not a result (``results_file``) keeps its status and its text."""
    usage = line.usage
    unreadable = record.get("status") == UNREADABLE
    return {
        "id": line.id,
        "status": UNREADABLE if unreadable else line.status,
        "stop_reason": line.stop_reason,
        "model": line.model,
        "run_id": line.run_id,
        "duration_s": line.duration_s,
        "total_tokens": None if usage is None else usage.total_tokens,
        "prompt_tokens": None if usage is None else usage.prompt_tokens,
        "completion_tokens": None if usage is None else usage.completion_tokens,
        "error": line.error,
        "line": as_text(record.get("line")),
    }


def _score(score: Score) -> dict[str, Any]:
    return {
        "passed": score.passed,
        "method": score.method,
        "explanation": Text.of(score.explanation) if score.explanation else None,
    }


def _step(run: CommandRun) -> dict[str, Any]:
    """A set-up or check command's result, its streams folded."""
    return {
        "exit_code": run.exit_code,
        "duration_ms": run.duration_ms,
        "timed_out": run.timed_out,
        "stdout": Text.of(run.stdout),
        "stderr": Text.of(run.stderr),
    }


def _artifacts(artifacts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Files the item kept: text shown folded, anything else as its encoded form."""
    shown = []
    for path, artifact in artifacts.items():
        details = artifact if isinstance(artifact, Mapping) else {"content": artifact}
        content = details.get("content")
        shown.append(
            {
                "path": path,
                "encoding": details.get("encoding") or "utf-8",
                "size": details.get("size") if isinstance(details.get("size"), int) else None,
                "truncated": bool(details.get("truncated")),
                "content": Text.of(content) if content is not None else None,
            }
        )
    return shown
