"""Each page of the viewer: what it reads from the viewer's sources, and what it shows."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from api.batch.summary import as_integer, as_number, as_text
from api.http.state.keys import ACTIVE
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
    filters, problems = ListFilters.parse(params, BATCH_STATUSES)
    listed = await viewer.batches.batches(filters.query())
    return Page(
        "batches.html",
        "Batches",
        {
            "batches": listed.rows,
            "pager": pager(listed, filters),
            "filters": filters,
            "problems": problems,
            "choices": {"status": BATCH_STATUSES, "per_page": LIST_PER_PAGE},
        },
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
    messages = record.get("messages")
    calls = record.get("tool_calls")
    view = conversation.from_transcript(
        messages if isinstance(messages, list) else [], calls if isinstance(calls, list) else []
    )
    artifacts = record.get("artifacts")
    metadata = record.get("metadata")
    return Page(
        "item.html",
        f"Item {record.get('id')}",
        {
            "batch": batch,
            "number": number,
            "item": _item_facts(record),
            "back": "?" + urlencode(params) if params else "",
            "has_next": number < batch.done,
            "view": view,
            "failed_calls": sum(call.is_error for call in view.tool_calls),
            "answer": Text.of(record["answer"]) if isinstance(record.get("answer"), str) else None,
            "score": _score(record["score"]) if isinstance(record.get("score"), dict) else None,
            "steps": [
                (title, _step(record[key]))
                for title, key in (("Set-up", "setup"), ("Check", "check"))
                if isinstance(record.get(key), dict)
            ],
            "artifacts": _artifacts(artifacts) if isinstance(artifacts, dict) else [],
            "metadata": [
                (str(key), value if isinstance(value, str) else json.dumps(value))
                for key, value in (metadata.items() if isinstance(metadata, dict) else [])
            ],
            "more": {k: Text.of(v) for k, v in record.items() if k not in SHOWN_FIELDS},
        },
    )


async def runs_page(viewer: Viewer, params: Mapping[str, str]) -> Page:
    if viewer.runs is None:
        return not_found("runs: this viewer reads a results file")
    filters, problems = ListFilters.parse(params, RUN_STATUSES)
    listed = await viewer.runs.runs(filters.query())
    return Page(
        "runs.html",
        "Runs",
        {
            "runs": listed.rows,
            "pager": pager(listed, filters),
            "filters": filters,
            "problems": problems,
            "choices": {"status": RUN_STATUSES, "per_page": LIST_PER_PAGE},
        },
    )


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


def _item_facts(record: Mapping[str, Any]) -> dict[str, Any]:
    """The scalars of an output record, each None when missing or of another type."""
    usage = record.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return {
        "id": str(record.get("id", "")),
        "status": as_text(record.get("status")) or "unknown",
        "stop_reason": as_text(record.get("stop_reason")),
        "model": as_text(record.get("model")),
        "run_id": as_text(record.get("run_id")),
        "duration_s": as_number(record.get("duration_s")),
        "total_tokens": as_integer(usage.get("total_tokens")),
        "prompt_tokens": as_integer(usage.get("prompt_tokens")),
        "completion_tokens": as_integer(usage.get("completion_tokens")),
        "error": as_text(record.get("error")),
        "line": as_text(record.get("line")),
    }


def _score(score: Mapping[str, Any]) -> dict[str, Any]:
    passed = score.get("passed")
    explanation = score.get("explanation")
    return {
        "passed": passed if isinstance(passed, bool) else None,
        "method": as_text(score.get("method")),
        "explanation": Text.of(explanation) if explanation not in (None, "") else None,
    }


def _step(step: Mapping[str, Any]) -> dict[str, Any]:
    """A set-up or check command's result, its streams folded."""
    return {
        "exit_code": step.get("exit_code") if isinstance(step.get("exit_code"), int) else None,
        "duration_ms": as_number(step.get("duration_ms")),
        "timed_out": bool(step.get("timed_out")),
        "stdout": Text.of(str(step.get("stdout") or "")),
        "stderr": Text.of(str(step.get("stderr") or "")),
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
