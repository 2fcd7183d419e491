"""``toolq report``: what a batch's results file says, summed up, with no fleet needed.

Counts by status and stop reason, the pass rate with its 95% Wilson interval, tokens, tool calls
by tool and by error kind, set-up and check failures, the slowest items. Each id counts once, by
its last line (``read_latest``), so an item run again replaces its earlier result.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from api.batch.figures import nearest_rank, pass_rate_line, wilson_interval
from api.batch.record import BatchRecord, CommandRun
from api.batch.results import read_latest
from api.batch.summary import as_text
from api.batch.task import CHECK_NOT_RUN, SETUP_FAILED

#: How many of the slowest items, and of the ids of each kind of failure, are listed.
SLOWEST = 10
IDS_LISTED = 10


@dataclass(frozen=True)
class _Item:
    """What the report needs of one result line: a file of long transcripts is not held."""

    id: str
    status: str
    stop_reason: str
    duration_s: float
    tokens: int
    score: tuple[bool, str] | None
    calls: list[tuple[str, bool, str | None]]
    setup: tuple[int, bool] | None
    check: tuple[int, bool] | None
    error: str
    #: The run's image and the digest it ran; None without one.
    image: tuple[str, str | None] | None

    @classmethod
    def of(cls, record: BatchRecord) -> _Item:
        score = record.score
        return cls(
            id=record.id,
            status=record.status,
            stop_reason=record.stop_reason or "none",
            duration_s=record.duration_s or 0.0,
            tokens=record.tokens or 0,
            score=None if score is None else (score.passed, str(score.method)),
            calls=[
                (str(c.get("name")), bool(c.get("is_error")), c.get("error_kind"))
                for c in record.tool_calls
            ],
            setup=_command(record.setup),
            check=_command(record.check),
            error=record.error or "",
            image=_image(record),
        )


def _image(record: BatchRecord) -> tuple[str, str | None] | None:
    image = record.image or {}
    reference = as_text(image.get("reference"))
    return None if reference is None else (reference, as_text(image.get("digest")))


def _result_item(record: BatchRecord) -> _Item | None:
    """A result line as the report needs it; None for a line without a status, which every
    result has and an input line has not."""
    return _Item.of(record) if record.has_status else None


def _command(run: CommandRun | None) -> tuple[int, bool] | None:
    return None if run is None else (run.exit_code, run.timed_out)


@dataclass
class _Failures:
    count: int = 0
    ids: list[str] = field(default_factory=list)

    def add(self, item_id: str) -> None:
        self.count += 1
        if len(self.ids) < IDS_LISTED:
            self.ids.append(item_id)


def build_report(path: Path) -> dict[str, Any]:
    """The report of a results file as one JSON-ready object."""
    latest = read_latest(path, _result_item)
    items = [item for item in latest.records.values() if item is not None]
    # An id whose last line has no status: a line of a batch's input, not a result.
    not_results = len(latest.records) - len(items)
    scored = [item.score for item in items if item.score is not None]
    passed = sum(1 for ok, _ in scored if ok)
    return {
        "file": str(path),
        "items": len(items),
        "unreadable_lines": len(latest.unreadable) + not_results,
        "status": dict(Counter(item.status for item in items).most_common()),
        "stop_reason": dict(Counter(item.stop_reason for item in items).most_common()),
        "score": _score(passed, len(scored), Counter(method for _, method in scored)),
        "tokens": _tokens([item.tokens for item in items]),
        "tool_calls": _tool_calls(items),
        "setup": _commands(items, "setup"),
        "check": _commands(items, "check"),
        "images": _images(items),
        "slowest": [
            {
                "id": item.id,
                "duration_s": item.duration_s,
                "status": item.status,
                "stop_reason": item.stop_reason,
                # Only where the item ran an image: a batch without one reads as before.
                **({"image": item.image[0]} if item.image else {}),
            }
            for item in sorted(items, key=lambda i: i.duration_s, reverse=True)[:SLOWEST]
        ],
    }


def _images(items: list[_Item]) -> list[dict[str, Any]]:
    """Each image the items ran, most items first: the digests it ran (a tag may have moved
    mid-batch), how many items ran it and how they ended."""
    by_reference: dict[str, list[_Item]] = {}
    for item in items:
        if item.image is not None:
            by_reference.setdefault(item.image[0], []).append(item)
    ordered = sorted(by_reference.items(), key=lambda pair: (-len(pair[1]), pair[0]))
    return [
        {
            "reference": reference,
            "digests": sorted({i.image[1] for i in ran if i.image and i.image[1]}),
            "items": len(ran),
            "status": dict(Counter(i.status for i in ran).most_common()),
        }
        for reference, ran in ordered
    ]


def _score(passed: int, scored: int, methods: Counter[str]) -> dict[str, Any] | None:
    if not scored:
        return None
    low, high = wilson_interval(passed, scored)
    return {
        "scored": scored,
        "passed": passed,
        "failed": scored - passed,
        "pass_rate": passed / scored,
        "ci95": [low, high],
        "by_method": dict(methods.most_common()),
    }


def _tokens(per_item: list[int]) -> dict[str, Any]:
    return {
        "total": sum(per_item),
        "p50_per_item": nearest_rank(per_item, 0.5),
        "p95_per_item": nearest_rank(per_item, 0.95),
    }


def _tool_calls(items: list[_Item]) -> dict[str, Any]:
    calls: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for item in items:
        for name, is_error, kind in item.calls:
            calls[name] += 1
            if is_error:
                failed[name] += 1
                kinds[kind or "unknown"] += 1
    return {
        "total": sum(calls.values()),
        "failed": sum(failed.values()),
        "by_tool": {name: {"calls": n, "failed": failed[name]} for name, n in calls.most_common()},
        "by_error_kind": dict(kinds.most_common()),
    }


def _commands(items: list[_Item], which: str) -> dict[str, Any]:
    """How the set-up (or check) commands went: ran, exited non-zero, timed out, could not run."""
    not_run_prefix = SETUP_FAILED if which == "setup" else CHECK_NOT_RUN
    ran = 0
    nonzero, timed_out, not_run = _Failures(), _Failures(), _Failures()
    for item in items:
        command = item.setup if which == "setup" else item.check
        if command is not None:
            ran += 1
            exit_code, timed = command
            if timed:
                timed_out.add(item.id)
            elif exit_code != 0:
                nonzero.add(item.id)
        elif item.error.startswith(not_run_prefix):
            not_run.add(item.id)
    return {
        "ran": ran,
        "exited_nonzero": asdict(nonzero),
        "timed_out": asdict(timed_out),
        "could_not_run": asdict(not_run),
    }


# --- As text -------------------------------------------------------------------------------------


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The report for a reader, a line per topic."""
    unreadable = report["unreadable_lines"]
    lines = [
        f"{report['file']}: {report['items']} items"
        + (f" ({unreadable} lines that are not results ignored)" if unreadable else ""),
        f"Status: {_counts(report['status'])}",
        f"Stop reasons: {_counts(report['stop_reason'])}",
    ]
    score = report["score"]
    if score is None:
        lines.append("Pass rate: no item was scored (no target or check)")
    else:
        lines.append(pass_rate_line(score["passed"], score["scored"]))
        lines.append(f"  by method: {_counts(score['by_method'])}")
    tokens = report["tokens"]
    if tokens["p50_per_item"] is None:
        lines.append("Tokens: none")
    else:
        lines.append(
            f"Tokens: {tokens['total']:,} in all; per item p50 {tokens['p50_per_item']:,}, "
            f"p95 {tokens['p95_per_item']:,}"
        )
    calls = report["tool_calls"]
    lines.append(f"Tool calls: {calls['total']:,}, {calls['failed']:,} failed")
    if calls["by_tool"]:
        by_tool = ", ".join(
            f"{name} {c['calls']:,} ({c['failed']:,} failed)"
            for name, c in calls["by_tool"].items()
        )
        lines.append(f"  by tool: {by_tool}")
    if calls["by_error_kind"]:
        lines.append(f"  by error kind: {_counts(calls['by_error_kind'])}")
    for which in ("setup", "check"):
        lines.append(_command_line(which.capitalize(), report[which]))
    if report["images"]:
        lines.append("Images:")
        lines += [
            f"  {image['reference']} ({', '.join(image['digests']) or 'no digest'}): "
            f"{image['items']:,} items, {_counts(image['status'])}"
            for image in report["images"]
        ]
    if report["slowest"]:
        lines.append("Slowest items:")
        lines += [
            f"  {s['duration_s']:8.2f} s  {s['id']} ({s['status']}, {s['stop_reason']}"
            + (f", image {s['image']})" if s.get("image") else ")")
            for s in report["slowest"]
        ]
    return lines


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{count:,} {name}" for name, count in counts.items()) or "none"


def _command_line(label: str, figures: Mapping[str, Any]) -> str:
    parts = [f"{figures['ran']:,} ran"]
    for key, words in (
        ("exited_nonzero", "exited non-zero"),
        ("timed_out", "timed out"),
        ("could_not_run", "could not run"),
    ):
        failures = figures[key]
        if failures["count"]:
            more = ", ..." if failures["count"] > len(failures["ids"]) else ""
            parts.append(f"{failures['count']:,} {words} ({', '.join(failures['ids'])}{more})")
    return f"{label}: {'; '.join(parts)}"


def run_report_command(path: Path, *, as_json: bool, out: Console, err: Console) -> int:
    """``toolq report``: 0, or 2 when the file cannot be read or holds no result."""
    try:
        report = build_report(path)
    except OSError as exc:
        _say(err, f"error: cannot read {path}: {exc.strerror or exc}")
        return 2
    if not report["items"] and report["unreadable_lines"]:
        _say(
            err,
            f"error: {path} holds no batch results: none of its {report['unreadable_lines']:,} "
            "lines is a result (an object with an id and a status); toolq report reads what "
            "toolq batch -o writes, not a batch's input",
        )
        return 2
    lines = [json.dumps(report, ensure_ascii=False)] if as_json else report_lines(report)
    for line in lines:
        _say(out, line)
    return 0


def _say(console: Console, text: str) -> None:
    """A line as it is: ids and paths are not markup, emoji codes or highlighting."""
    console.print(text, markup=False, emoji=False, highlight=False, soft_wrap=True)
